// A c10d::Backend whose collectives are a Python object's methods: what lets Python code be the backend
// torch registers for a device type in the ProcessGroup it builds (group name, device dispatch,
// coalescing), as ProcessGroupGloo is. torch binds c10d::Backend without a constructor or a trampoline,
// so this one C++ class stands between them. It holds no logic: every virtual method torch calls
// calls the method of the same torch name on the Python object (`impl`), with the GIL held.
// The Work a Python method returns is wrapped in PythonWork, which keeps the Python object alive and
// forwards the queries torch makes from C++ (wait, future, completion, source rank, result).
//
// The calls whose latency users see have a shorter way through: a blocking all_reduce or broadcast of
// one host tensor numpy can view (`dist.all_reduce(t)`, `dist.broadcast(t, src)`) and a blocking
// barrier. The tensor's numpy view is made here and handed to impl's `allreduce_now` (with torch's op
// number) or `broadcast_now` (with the root); no options object crosses into Python. Their work is a
// DoneWork made here, finished from the start (no Python work, no GIL to wait on it). The views of
// small tensors are kept for the next call on the same memory (Views).
//
// Built on first use by allreduce/torch/c10d/native.py (torch.utils.cpp_extension.load).

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/tensor_numpy.h>
#include <pybind11/chrono.h>

#include <array>

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

// The work of a collective that already ran in the caller's thread: finished, its outputs `outputs`.
// One per call (a caller may hold the work of one call while the next runs); it holds no Python object.
class DoneWork : public Work {
 public:
  DoneWork(const Tensors& outputs, c10d::OpType type) : Work(-1, type), outputs_(outputs) {
    completed_ = true;
  }

  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  std::exception_ptr exception() const override { return nullptr; }
  int sourceRank() const override { return -1; }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {}

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {  // made only when someone asks
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(outputs_));
    return future;
  }

 private:
  Tensors outputs_;
};

// Whether numpy can view `t` as it is (what `Tensor.numpy()` accepts): the other tensors take impl's
// general path, which stages them or says why not.
bool numpy_viewable(const at::Tensor& t) {
  if (t.layout() != c10::kStrided || !t.device().is_cpu() || !t.is_contiguous() || t.is_conj() || t.is_neg()) {
    return false;
  }
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kLong: case at::kInt: case at::kShort:
    case at::kChar: case at::kByte: case at::kBool: case at::kComplexFloat: case at::kComplexDouble:
      return true;
    default:
      return false;
  }
}

// Flat numpy views of small tensors, kept for the next call on the same memory. A view is fully
// described by its address, element count and dtype, so it is the memory of whichever tensor a later
// call passes with those three. A kept view keeps the memory it was made from alive (its numpy base
// holds the storage), so at most kKept blocks of at most kKeptBytes each. Used with the GIL held.
class Views {
 public:
  static constexpr size_t kKept = 8;
  static constexpr size_t kKeptBytes = 64 * 1024;

  py::object of(const at::Tensor& t) {
    const void* data = t.data_ptr();
    const int64_t count = t.numel();
    const at::ScalarType type = t.scalar_type();
    for (const Entry& e : kept_) {
      if (e.data == data && e.count == count && e.type == type) {
        return e.view;
      }
    }
    PyObject* array = torch::utils::tensor_to_numpy(t.requires_grad() ? t.detach() : t);
    if (array == nullptr) {
      throw py::error_already_set();
    }
    py::object view = py::reinterpret_steal<py::object>(array).attr("reshape")(-1);
    if (t.nbytes() <= kKeptBytes) {
      kept_[next_] = Entry{data, count, type, view};
      next_ = (next_ + 1) % kKept;
    }
    return view;
  }

  // Drops the views: with the GIL held, or (interpreter gone) without freeing them.
  void clear(bool interpreter_alive) {
    for (Entry& e : kept_) {
      if (interpreter_alive) {
        e.view = py::object();
      } else {
        e.view.release();
      }
    }
  }

 private:
  struct Entry {
    const void* data = nullptr;
    int64_t count = -1;  // matches no tensor
    at::ScalarType type = at::kFloat;
    py::object view;
  };
  std::array<Entry, kKept> kept_;
  size_t next_ = 0;
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
      views_.clear(true);
      for (py::object& method : now_) {
        method = py::object();
      }
      impl_ = py::object();
    } else {
      views_.clear(false);
      for (py::object& method : now_) {
        method.release();
      }
      impl_.release();
    }
  }

  py::object impl() const { return impl_; }

  const std::string getBackendName() const override { return name_; }
  bool supportsCoalescing() const override { return true; }

  WorkPtr broadcast(Tensors& t, const c10d::BroadcastOptions& o) override {
    if (o.asyncOp || t.size() != 1 || !numpy_viewable(t[0])) {
      FORWARD("broadcast", t, o);
    }
    py::gil_scoped_acquire gil;
    now(kBroadcast, "broadcast_now", views_.of(t[0]), o.rootRank);
    return c10::make_intrusive<DoneWork>(t, c10d::OpType::BROADCAST);
  }
  WorkPtr allreduce(Tensors& t, const c10d::AllreduceOptions& o) override {
    if (o.asyncOp || t.size() != 1 || !numpy_viewable(t[0])) {
      FORWARD("allreduce", t, o);
    }
    py::gil_scoped_acquire gil;
    now(kAllreduce, "allreduce_now", views_.of(t[0]), static_cast<int>(o.reduceOp.op_));
    return c10::make_intrusive<DoneWork>(t, c10d::OpType::ALLREDUCE);
  }
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
  WorkPtr barrier(const c10d::BarrierOptions& o) override {
    if (o.asyncOp) {
      FORWARD("barrier", o);
    }
    py::gil_scoped_acquire gil;
    now(kBarrier, "barrier_now");
    return c10::make_intrusive<DoneWork>(Tensors(), c10d::OpType::BARRIER);
  }
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
  bool supportsShrinking() const override { return true; }
  // torch.distributed.shrink_group: impl.shrink forms the survivors' group and returns its impl.
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<Options>& /*opts_override*/) override {
    py::gil_scoped_acquire gil;
    py::object impl = call("shrink", ranks_to_exclude, shrink_flags);
    py::object group = impl.attr("group");
    return c10::make_intrusive<PythonBackend>(group.attr("rank").cast<int>(), group.attr("size").cast<int>(), name_,
                                              impl);
  }

 private:
  // impl's method `name` called with `args`; the caller holds the GIL.
  template <typename... Args>
  py::object call(const char* name, Args&&... args) {
    TORCH_CHECK(py::hasattr(impl_, name), "Backend ", name_, " does not support ", name);
    return impl_.attr(name)(std::forward<Args>(args)...);
  }

  // impl's method `name` of the short way, bound on its first call into now_[which], called with
  // `args`; the caller holds the GIL.
  enum Now { kAllreduce, kBroadcast, kBarrier, kNows };
  template <typename... Args>
  void now(Now which, const char* name, Args&&... args) {
    if (!now_[which]) {
      now_[which] = impl_.attr(name);
    }
    now_[which](std::forward<Args>(args)...);
  }

  std::string name_;
  py::object impl_;
  std::array<py::object, kNows> now_;
  Views views_;  // of the tensors of recent short-way calls
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<PythonBackend, c10d::Backend, c10::intrusive_ptr<PythonBackend>>(m, "PythonBackend")
      .def(py::init([](int rank, int size, std::string name, py::object impl) {
             return c10::make_intrusive<PythonBackend>(rank, size, std::move(name), std::move(impl));
           }),
           py::arg("rank"), py::arg("size"), py::arg("name"), py::arg("impl"))
      .def_property_readonly("impl", &PythonBackend::impl);
}
