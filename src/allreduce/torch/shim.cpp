// A c10d::Backend whose collectives are a Python object's methods: what lets Python code be the backend
// torch registers for a device type in the ProcessGroup it builds (group name, device dispatch,
// coalescing), as ProcessGroupGloo is. torch binds c10d::Backend without a constructor or a trampoline,
// so this one C++ class stands between them. It holds no logic: every virtual method torch calls
// calls the method of the same torch name on the Python object (`impl`), with the GIL held.
// The Work a Python method returns is wrapped in PythonWork, which keeps the Python object alive and
// forwards the queries torch makes from C++ (wait, future, completion, source rank, result).
//
// Built on first use by allreduce/torch/native.py (torch.utils.cpp_extension.load).

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>

namespace py = pybind11;
using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;
using Tensors = std::vector<at::Tensor>;

namespace {

// A Python torch.distributed.Work (a subclass with wait/get_future) seen from C++.
class PythonWork : public Work {
 public:
  explicit PythonWork(py::object work) : work_(work.cast<WorkPtr>()), py_(std::move(work)) {}

  ~PythonWork() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      py_ = py::object();
    } else {
      py_.release();  // the interpreter is gone: nothing left to free it with
    }
  }

  bool wait(std::chrono::milliseconds timeout) override { return work_->wait(timeout); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return work_->getFuture(); }
  bool isCompleted() override { return ask<bool>("is_completed"); }
  bool isSuccess() const override { return ask<bool>("is_success"); }
  int sourceRank() const override { return ask<int>("source_rank"); }
  std::vector<at::Tensor> result() override { return ask<Tensors>("result"); }
  void synchronize() override {}

  std::exception_ptr exception() const override {
    py::gil_scoped_acquire gil;
    py::object error = py_.attr("exception")();
    if (error.is_none()) {
      return nullptr;
    }
    return std::make_exception_ptr(std::runtime_error(py::str(error).cast<std::string>()));
  }

 private:
  template <typename R>
  R ask(const char* method) const {
    py::gil_scoped_acquire gil;
    return py_.attr(method)().template cast<R>();
  }

  WorkPtr work_;
  py::object py_;
};

}  // namespace

// Calls impl's method `name` and wraps the Work it returns. Every Python object is made and freed
// with the GIL held: call() leaves that to its caller, whose scope outlives the temporaries.
#define FORWARD(name, ...)      \
  py::gil_scoped_acquire gil; \
  return c10::make_intrusive<PythonWork>(call(name, ##__VA_ARGS__))

class PythonBackend : public c10d::Backend {
 public:
  PythonBackend(int rank, int size, std::string name, py::object impl)
      : c10d::Backend(rank, size), name_(std::move(name)), impl_(std::move(impl)) {}

  ~PythonBackend() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      impl_ = py::object();
    } else {
      impl_.release();
    }
  }

  py::object impl() const { return impl_; }

  const std::string getBackendName() const override { return name_; }
  bool supportsCoalescing() const override { return true; }

  WorkPtr broadcast(Tensors& t, const c10d::BroadcastOptions& o) override { FORWARD("broadcast", t, o); }
  WorkPtr allreduce(Tensors& t, const c10d::AllreduceOptions& o) override { FORWARD("allreduce", t, o); }
  WorkPtr allreduce_sparse(Tensors& t, const c10d::AllreduceOptions& o) override {
    FORWARD("allreduce_sparse", t, o);
  }
  WorkPtr allreduce_coalesced(Tensors& t, const c10d::AllreduceCoalescedOptions& o) override {
    FORWARD("allreduce_coalesced", t, o);
  }
  WorkPtr reduce(Tensors& t, const c10d::ReduceOptions& o) override { FORWARD("reduce", t, o); }
  WorkPtr allgather(std::vector<Tensors>& out, Tensors& in, const c10d::AllgatherOptions& o) override {
    FORWARD("allgather", out, in, o);
  }
  WorkPtr _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& o) override {
    FORWARD("_allgather_base", out, in, o);
  }
  WorkPtr allgather_coalesced(std::vector<Tensors>& out, Tensors& in, const c10d::AllgatherOptions& o) override {
    FORWARD("allgather_coalesced", out, in, o);
  }
  WorkPtr allgather_into_tensor_coalesced(Tensors& out, Tensors& in, const c10d::AllgatherOptions& o) override {
    FORWARD("allgather_into_tensor_coalesced", out, in, o);
  }
  WorkPtr gather(std::vector<Tensors>& out, Tensors& in, const c10d::GatherOptions& o) override {
    FORWARD("gather", out, in, o);
  }
  WorkPtr scatter(Tensors& out, std::vector<Tensors>& in, const c10d::ScatterOptions& o) override {
    FORWARD("scatter", out, in, o);
  }
  WorkPtr reduce_scatter(Tensors& out, std::vector<Tensors>& in, const c10d::ReduceScatterOptions& o) override {
    FORWARD("reduce_scatter", out, in, o);
  }
  WorkPtr _reduce_scatter_base(at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& o) override {
    FORWARD("_reduce_scatter_base", out, in, o);
  }
  WorkPtr reduce_scatter_tensor_coalesced(Tensors& out, Tensors& in, const c10d::ReduceScatterOptions& o) override {
    FORWARD("reduce_scatter_tensor_coalesced", out, in, o);
  }
  WorkPtr alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                        std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& o) override {
    FORWARD("alltoall_base", out, in, out_splits, in_splits, o);
  }
  WorkPtr alltoall(Tensors& out, Tensors& in, const c10d::AllToAllOptions& o) override {
    FORWARD("alltoall", out, in, o);
  }
  WorkPtr barrier(const c10d::BarrierOptions& o) override { FORWARD("barrier", o); }
  WorkPtr send(Tensors& t, int dst, int tag) override { FORWARD("send", t, dst, tag); }
  WorkPtr recv(Tensors& t, int src, int tag) override { FORWARD("recv", t, src, tag); }
  WorkPtr recvAnysource(Tensors& t, int tag) override { FORWARD("recv_anysource", t, tag); }
  WorkPtr endCoalescing() override { FORWARD("_end_coalescing"); }

  void startCoalescing() override {
    py::gil_scoped_acquire gil;
    call("_start_coalescing");
  }
  void monitoredBarrier(const c10d::BarrierOptions& o, bool wait_all_ranks) override {
    py::gil_scoped_acquire gil;
    call("monitored_barrier", o, wait_all_ranks);
  }
  void setSequenceNumberForGroup() override {}  // our groups number their collectives from the start
  uint64_t getSequenceNumberForGroup() override {
    py::gil_scoped_acquire gil;
    return call("_get_sequence_number_for_group").cast<uint64_t>();
  }
  void shutdown() override {
    py::gil_scoped_acquire gil;
    call("shutdown");
  }
  void abort() override {
    py::gil_scoped_acquire gil;
    call("abort");
  }

 private:
  // impl's method `name` called with `args`; the caller holds the GIL.
  template <typename... Args>
  py::object call(const char* name, Args&&... args) {
    TORCH_CHECK(py::hasattr(impl_, name), "Backend ", name_, " does not support ", name);
    return impl_.attr(name)(std::forward<Args>(args)...);
  }

  std::string name_;
  py::object impl_;
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<PythonBackend, c10d::Backend, c10::intrusive_ptr<PythonBackend>>(m, "PythonBackend")
      .def(py::init([](int rank, int size, std::string name, py::object impl) {
             return c10::make_intrusive<PythonBackend>(rank, size, std::move(name), std::move(impl));
           }),
           py::arg("rank"), py::arg("size"), py::arg("name"), py::arg("impl"))
      .def_property_readonly("impl", &PythonBackend::impl);
}
