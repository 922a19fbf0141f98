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
// small tensors are kept for the next call on the same memory (Views). Once the group has a compiled
// shortcut for the call's shape (allreduce/native/_line_plans.c's Shortcut, which `*_now` returns), the
// call goes straight to it through the C entry _line_plans exports, with no Python in between (Shortcuts).
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

// Lets go of a kept Python object: with the GIL held, or (interpreter gone) without freeing it, as there
// is nothing left to free it with.
void drop(py::object& kept, bool interpreter_alive) {
  if (interpreter_alive) {
    kept = py::object();
  } else {
    kept.release();
  }
}

// A Python torch.distributed.Work (a subclass with wait/get_future) seen from C++.
class PythonWork : public Work {
 public:
  explicit PythonWork(py::object work) : work_(work.cast<WorkPtr>()), py_(std::move(work)) {}

  ~PythonWork() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      drop(py_, true);
    } else {
      drop(py_, false);
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
      drop(e.view, interpreter_alive);
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

// What a blocking call of the short way is, as far as its shortcut goes: the method (Now), the tensor's
// dtype and element count, and torch's op number (all-reduce) or the root (broadcast).
struct Shape {
  int method = -1;  // matches no call
  at::ScalarType type = at::kByte;
  int64_t count = 0;
  int arg = 0;
  bool operator==(const Shape& o) const {
    return method == o.method && type == o.type && count == o.count && arg == o.arg;
  }
};

// The group's compiled shortcuts of recent call shapes: for each, what impl's `*_now` method returned
// after its last call of that shape (None where the group has no compiled one). A shortcut holds itself
// to the rules: it answers 0 (nothing done) where the general path must take the call (the group busy,
// broken or destroyed, another thread's call in flight) and once stale (its group retired it on a
// re-plan or a refusal, or the determinism mode changed since it was made), so a kept one can never run
// a call wrongly, only send it the general way, whose `*_now` then returns the shortcut to keep.
// Used with the GIL held.
class Shortcuts {
 public:
  static constexpr size_t kKept = 8;

  py::object of(const Shape& shape) const {
    for (const Entry& e : kept_) {
      if (e.shape == shape) {
        return e.shortcut;
      }
    }
    return py::object();
  }

  void keep(const Shape& shape, py::object shortcut) {
    for (Entry& e : kept_) {
      if (e.shape == shape) {
        e.shortcut = std::move(shortcut);
        return;
      }
    }
    kept_[next_] = Entry{shape, std::move(shortcut)};
    next_ = (next_ + 1) % kKept;
  }

  // 1: shortcut ran the call on `data` (a numpy view, or None for a barrier); 0: the general path must
  // take it; -1: it raised (the Python error set). The entry is _line_plans.c's shortcut_run, found through
  // its capsule on the first shortcut: one exists only where allreduce.native._line_plans loaded.
  int run(const py::object& shortcut, const py::object& data) {
    if (shortcut.is_none()) {
      return 0;
    }
    if (run_ == nullptr) {
      run_ = reinterpret_cast<Run>(PyCapsule_Import("allreduce.native._line_plans._C_API", 0));
      if (run_ == nullptr) {
        throw py::error_already_set();
      }
    }
    return run_(shortcut.ptr(), data.ptr());
  }

  // Drops the shortcuts: with the GIL held, or (interpreter gone) without freeing them.
  void clear(bool interpreter_alive) {
    for (Entry& e : kept_) {
      drop(e.shortcut, interpreter_alive);
    }
  }

 private:
  using Run = int (*)(PyObject* shortcut, PyObject* data);
  struct Entry {
    Shape shape;
    py::object shortcut;
  };
  std::array<Entry, kKept> kept_;
  size_t next_ = 0;
  Run run_ = nullptr;
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
      drop_all(true);
    } else {
      drop_all(false);
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
    short_way(kBroadcast, "broadcast_now", &t[0], static_cast<int>(o.rootRank));
    return c10::make_intrusive<DoneWork>(t, c10d::OpType::BROADCAST);
  }
  WorkPtr allreduce(Tensors& t, const c10d::AllreduceOptions& o) override {
    if (o.asyncOp || t.size() != 1 || !numpy_viewable(t[0])) {
      FORWARD("allreduce", t, o);
    }
    py::gil_scoped_acquire gil;
    short_way(kAllreduce, "allreduce_now", &t[0], static_cast<int>(o.reduceOp.op_));
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
    short_way(kBarrier, "barrier_now", nullptr, 0);
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
  // `args`; what it returns. The caller holds the GIL.
  enum Now { kAllreduce, kBroadcast, kBarrier, kFailed, kNows };
  template <typename... Args>
  py::object now(Now which, const char* name, Args&&... args) {
    if (!now_[which]) {
      now_[which] = impl_.attr(name);
    }
    return now_[which](std::forward<Args>(args)...);
  }

  // A blocking call of the short way on tensor `t` (none: a barrier), `arg` its op number or root: on
  // the shape's compiled shortcut where it takes the call, counted in impl's `sequence` as `*_now` counts
  // its own; else by impl's method `name`, keeping the shortcut it returns. A shortcut's error is raised
  // by impl's `now_failed`, in the words `*_now` would have used. The caller holds the GIL.
  void short_way(Now which, const char* name, const at::Tensor* t, int arg) {
    const Shape shape{which, t ? t->scalar_type() : at::kByte, t ? t->numel() : 0, arg};
    py::object data = t ? views_.of(*t) : py::none();
    py::object shortcut = shortcuts_.of(shape);
    if (shortcut) {
      int ran = shortcuts_.run(shortcut, data);
      if (ran < 0) {
        py::error_already_set error;  // the call's exception, out of Python's error state
        now(kFailed, "now_failed", error.value());  // raises it in torch's words
        throw error;  // as it was, should now_failed ever return
      }
      if (ran > 0) {
        count_sequence();
        return;
      }
    }
    shortcuts_.keep(shape, t ? now(which, name, data, arg) : now(which, name));
  }

  // impl.sequence += 1, with the GIL held.
  void count_sequence() {
    if (!sequence_) {
      sequence_ = py::str("sequence");
    }
    py::object count = impl_.attr(sequence_);
    impl_.attr(sequence_) = count + py::int_(1);
  }

  // Lets go of every Python object held (see drop).
  void drop_all(bool interpreter_alive) {
    views_.clear(interpreter_alive);
    shortcuts_.clear(interpreter_alive);
    drop(sequence_, interpreter_alive);
    for (py::object& method : now_) {
      drop(method, interpreter_alive);
    }
    drop(impl_, interpreter_alive);
  }

  std::string name_;
  py::object impl_;
  std::array<py::object, kNows> now_;
  py::object sequence_;  // the name of impl's count
  Views views_;  // of the tensors of recent short-way calls
  Shortcuts shortcuts_;  // of the shapes of recent short-way calls
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<PythonBackend, c10d::Backend, c10::intrusive_ptr<PythonBackend>>(m, "PythonBackend")
      .def(py::init([](int rank, int size, std::string name, py::object impl) {
             return c10::make_intrusive<PythonBackend>(rank, size, std::move(name), std::move(impl));
           }),
           py::arg("rank"), py::arg("size"), py::arg("name"), py::arg("impl"))
      .def_property_readonly("impl", &PythonBackend::impl);
}
