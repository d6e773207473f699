// epd._core: the Python drop-ins for the engine reference's cache and
// scheduler classes, over the C++ core.
//
// Keys and values are arbitrary Python objects. Keys hash and compare as a
// dict's do: a key is hashed once, when it comes in, and the hash is kept with
// the stored key (so eviction never calls __hash__ again, and a key whose
// __hash__ starts to raise is still evicted); two keys match when their hashes
// are equal and they are the same object or ==. Anything usable as a dict key
// in the reference is usable here, and an unhashable key raises the same
// TypeError. Values are kept alive by the cache (it holds a reference).
//
// Threads and re-entry. The GIL alone does not make a call atomic: Python code
// run from inside a call (a key's __hash__ and __eq__, a dropped key's or
// value's __del__, on_evict, to_host, to_device) lets the interpreter switch
// threads, or may call back into the same cache. So:
//   - every call takes a per-cache lock (a TieredEmbeddingCache and its .l1
//     and .l2 share one). The thread holding it may take it again, so a
//     callback can use the cache; another thread waits for the whole call to
//     finish, with the GIL released while it waits, since the holder may need
//     the GIL to get there. A callback must therefore not wait for another
//     thread that uses the same cache.
//   - a key is hashed before the lock is taken;
//   - the core is consistent whenever a callback runs (epd/core/embedding_cache.h:
//     "Re-entry"), so a re-entrant call sees the state the reference would.
// Callbacks run with the GIL held. The C++ work per call is O(1), so
// releasing the GIL around it would cost more than it saves.
//
// Errors are translated here, once: epd::Error(kInvalidArgument) becomes
// ValueError with the same message as the reference; a byte count or cost that
// does not fit the core's int64 counters (epd::kMaxCacheBytes) is a ValueError
// too, not an overflow; an exception raised by a Python callback (on_evict,
// to_host, to_device, __eq__) propagates unchanged, and the cache is left in
// the state the reference leaves (see the C++ headers).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "epd/core/embedding_cache.h"
#include "epd/core/encode_scheduler.h"
#include "epd/core/status.h"
#include "epd/core/tiered_cache.h"

namespace py = pybind11;

namespace epd {

template <>
struct ValueTraits<py::object> {
  static bool IsNone(const py::object& v) { return v.is_none(); }
  static constexpr bool kNullCopyDrops = false;  // the reference stores what to_host returns
};

namespace {

// A key with the hash it had when it came in.
struct PyKey {
  py::object obj;
  Py_hash_t hash = 0;
};
PyKey MakeKey(const py::handle& key) { return PyKey{py::reinterpret_borrow<py::object>(key), py::hash(key)}; }

struct PyKeyHash {
  std::size_t operator()(const PyKey& k) const { return static_cast<std::size_t>(k.hash); }
};
struct PyKeyEq {
  bool operator()(const PyKey& a, const PyKey& b) const {
    if (a.hash != b.hash) return false;
    if (a.obj.is(b.obj)) return true;
    // Own references for the call, as dict lookups take: __eq__ may re-enter
    // the cache and drop the stored key while it runs.
    const py::object x = a.obj;
    const py::object y = b.obj;
    return x.equal(y);
  }
};

using PyCache = EmbeddingCache<PyKey, py::object, PyKeyHash, PyKeyEq>;
using PyTiered = TieredEmbeddingCache<PyKey, py::object, PyKeyHash, PyKeyEq>;

// The per-cache lock (see the top of the file). REQUIRES: the GIL is held by
// the caller of Lock() and Unlock().
class ReentrantLock {
 public:
  void Lock() {
    const std::thread::id me = std::this_thread::get_id();
    if (owner_.load(std::memory_order_relaxed) == me) {
      ++depth_;
      return;
    }
    if (!mu_.try_lock()) {
      py::gil_scoped_release no_gil;  // the holder may need the GIL to finish
      mu_.lock();
    }
    owner_.store(me, std::memory_order_relaxed);
    depth_ = 1;
  }
  void Unlock() {
    if (--depth_ == 0) {
      owner_.store(std::thread::id(), std::memory_order_relaxed);
      mu_.unlock();
    }
  }

 private:
  std::mutex mu_;
  std::atomic<std::thread::id> owner_{};
  int depth_ = 0;  // written only by the owner
};

class Held {
 public:
  explicit Held(ReentrantLock& lock) : lock_(lock) { lock_.Lock(); }
  ~Held() { lock_.Unlock(); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

 private:
  ReentrantLock& lock_;
};

// A Python integer (anything with __index__; TypeError otherwise, as before)
// read into an int64; `overflow` is its sign when it does not fit.
struct PyInt {
  std::int64_t value = 0;
  int overflow = 0;
  std::string text;  // its decimal text when it does not fit
};
PyInt ReadInt(const py::handle& v) {
  const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  PyInt out;
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &out.overflow);
  if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
  out.value = x;
  if (out.overflow != 0) out.text = py::str(i).cast<std::string>();
  return out;
}

// A capacity or charge: ValueError (the core's message) outside [0, kMaxCacheBytes].
std::int64_t ToCacheBytes(const py::handle& v, const std::string& name) {
  const PyInt i = ReadInt(v);
  if (i.overflow != 0) throw Error(CacheBytesOutOfRange(name, i.overflow < 0, i.text));
  CheckCacheBytes(name, i.value);
  return i.value;
}

// Any other count the core holds in an int64: ValueError when it does not fit.
std::int64_t ToInt64(const py::handle& v, const std::string& name) {
  const PyInt i = ReadInt(v);
  if (i.overflow != 0) {
    throw Error(StatusCode::kInvalidArgument, name + " must fit in a signed 64-bit integer, got " + i.text);
  }
  return i.value;
}

PyCache::EvictHook WrapHook(const py::object& on_evict) {
  if (on_evict.is_none()) return nullptr;
  return [on_evict](const PyKey& key, py::object&& value, std::int64_t nbytes) {
    on_evict(key.obj, std::move(value), nbytes);
  };
}

// The reference's default copies: `.cpu()` / `.to(device)` on the value, or on
// each element of a tuple, keeping None elements.
py::object MapEmbedding(const py::object& value, const std::function<py::object(const py::object&)>& f) {
  if (py::isinstance<py::tuple>(value)) {
    py::tuple in = value.cast<py::tuple>();
    py::tuple out(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      py::object t = in[i];
      out[i] = t.is_none() ? py::none() : f(t);
    }
    return out;
  }
  return f(value);
}

PyTiered::CopyFn WrapCopy(const py::object& fn, std::function<py::object(const py::object&)> fallback) {
  if (!fn.is_none()) {
    return [fn](const py::object& v) { return fn(v); };
  }
  return [fallback = std::move(fallback)](const py::object& v) { return MapEmbedding(v, fallback); };
}

py::object OrNone(std::optional<py::object> v) { return v.has_value() ? std::move(*v) : py::none(); }

// The lock-and-call shape shared by what Python sees as a cache: a call
// hashes the key (MakeKey) before it takes the reentrant lock that guards
// `Cache`, then calls the cache under it. `Cache` is PyCache or PyTiered; a
// tiered cache shares its lock with the views of its tiers.
template <typename Cache>
class LockedCacheRef {
 public:
  py::object Get(const py::handle& key) {
    const PyKey k = MakeKey(key);
    Held held(*lock_);
    return OrNone(cache_->Get(k));
  }
  bool Contains(const py::handle& key) {
    const PyKey k = MakeKey(key);
    Held held(*lock_);
    return cache_->Contains(k);
  }
  // A counter or size, read under the lock so that it is never a value from
  // the middle of another thread's call.
  template <typename F>
  auto Read(F f) {
    Held held(*lock_);
    return f(*cache_);
  }

 protected:
  // A cache of its own, under a lock of its own.
  explicit LockedCacheRef(std::unique_ptr<Cache> owned)
      : lock_(std::make_shared<ReentrantLock>()), owned_(std::move(owned)), cache_(owned_.get()) {}
  // A view of a cache owned elsewhere (a tier), under its owner's lock.
  LockedCacheRef(Cache* view, std::shared_ptr<ReentrantLock> lock) : lock_(std::move(lock)), cache_(view) {}

  std::shared_ptr<ReentrantLock> lock_;
  std::unique_ptr<Cache> owned_;  // null for a view
  Cache* cache_;
};

// What Python sees as an EmbeddingCache: a cache of its own, or one tier of a
// TieredEmbeddingCache (then under the tiered cache's lock).
class PyCacheRef : public LockedCacheRef<PyCache> {
 public:
  PyCacheRef(std::int64_t capacity_bytes, PyCache::EvictHook on_evict)
      : LockedCacheRef(std::make_unique<PyCache>(capacity_bytes, std::move(on_evict))) {}
  PyCacheRef(PyCache* tier, std::shared_ptr<ReentrantLock> lock) : LockedCacheRef(tier, std::move(lock)) {}

  void Put(const py::handle& key, py::object value, const py::handle& nbytes) {
    const std::int64_t n = ToCacheBytes(nbytes, "nbytes");
    // Skipped before the key is hashed, as the reference skips it (the
    // capacity never changes).
    if (n > cache_->capacity_bytes()) return;
    const PyKey k = MakeKey(key);
    Held held(*lock_);
    cache_->Put(k, std::move(value), n);
  }
  py::object Pop(const py::handle& key) {
    const PyKey k = MakeKey(key);
    std::optional<PoppedEntry<py::object>> p;
    {
      Held held(*lock_);
      p = cache_->Pop(k);
    }
    if (!p.has_value()) return py::none();
    return py::make_tuple(std::move(p->value), p->nbytes);
  }
};

// What Python sees as a TieredEmbeddingCache; .l1 and .l2 are views of its
// tiers under its lock.
class PyTieredRef : public LockedCacheRef<PyTiered> {
 public:
  PyTieredRef(std::int64_t l1_bytes, std::int64_t l2_bytes, PyTiered::CopyFn to_host, PyTiered::CopyFn to_device)
      : LockedCacheRef(std::make_unique<PyTiered>(l1_bytes, l2_bytes, std::move(to_host), std::move(to_device))),
        l1_(&cache_->l1(), lock_),
        l2_(&cache_->l2(), lock_) {}

  void Put(const py::handle& key, py::object value, const py::handle& nbytes) {
    const PyInt n = ReadInt(nbytes);
    const PyKey k = MakeKey(key);
    Held held(*lock_);
    if (n.overflow != 0) {
      // In the tiered put's order: the stale L2 copy goes first, then the
      // charge is refused (the core does the same for an int64 out of range).
      cache_->l2().Pop(k);
      throw Error(CacheBytesOutOfRange("nbytes", n.overflow < 0, n.text));
    }
    cache_->Put(k, std::move(value), n.value);
  }
  PyCacheRef& l1() { return l1_; }
  PyCacheRef& l2() { return l2_; }

 private:
  PyCacheRef l1_;
  PyCacheRef l2_;
};

// The reference's EncodeScheduler knows by_key and fifo only.
ScheduleOrder ParseOrder(const std::string& order) {
  StatusOr<ScheduleOrder> o = ParseScheduleOrder(order);
  if (!o.ok() || *o == ScheduleOrder::kFair) {
    throw Error(StatusCode::kInvalidArgument, "order must be 'by_key' or 'fifo', got '" + order + "'");
  }
  return *o;
}

}  // namespace
}  // namespace epd

PYBIND11_MODULE(_core, m) {
  using namespace epd;
  m.doc() = "C++ core of epd-encode: embedding caches and the encode scheduler.";

  // NOLINTNEXTLINE(performance-unnecessary-value-param): pybind11's translator is void (*)(std::exception_ptr).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      if (e.code() == StatusCode::kInvalidArgument) {
        PyErr_SetString(PyExc_ValueError, e.status().message().c_str());
      } else {
        PyErr_SetString(PyExc_RuntimeError, e.what());
      }
    }
  });

  py::class_<PyCacheRef>(m, "EmbeddingCache",
                         "Bytes-bounded LRU cache of vision-tower outputs, keyed by content hash.\n\n"
                         "on_evict(key, value, nbytes) fires only for capacity-overflow victims, oldest first.\n"
                         "Safe to share across threads; callbacks may call back into the cache.")
      .def(py::init([](const py::object& capacity_bytes, const py::object& on_evict) {
             return std::make_unique<PyCacheRef>(ToCacheBytes(capacity_bytes, "capacity_bytes"), WrapHook(on_evict));
           }),
           py::arg("capacity_bytes"), py::arg("on_evict") = py::none())
      .def("get", &PyCacheRef::Get, py::arg("key"), "The value (marked most recently used), or None on a miss.")
      .def("put", &PyCacheRef::Put, py::arg("key"), py::arg("value"), py::arg("nbytes"),
           "Insert or replace as MRU, then evict LRU entries while over capacity.")
      .def("pop", &PyCacheRef::Pop, py::arg("key"),
           "Remove key and return (value, nbytes), or None. Counts no hit/miss and fires no hook.")
      .def("__contains__", &PyCacheRef::Contains)
      .def("__len__", [](PyCacheRef& c) { return c.Read([](const PyCache& x) { return x.size(); }); })
      .def_property_readonly("capacity_bytes",
                             [](PyCacheRef& c) { return c.Read([](const PyCache& x) { return x.capacity_bytes(); }); })
      .def_property_readonly("current_bytes",
                             [](PyCacheRef& c) { return c.Read([](const PyCache& x) { return x.current_bytes(); }); })
      .def_property_readonly("hits", [](PyCacheRef& c) { return c.Read([](const PyCache& x) { return x.hits(); }); })
      .def_property_readonly("misses",
                             [](PyCacheRef& c) { return c.Read([](const PyCache& x) { return x.misses(); }); })
      .def_property_readonly("evictions",
                             [](PyCacheRef& c) { return c.Read([](const PyCache& x) { return x.evictions(); }); });

  py::class_<PyTieredRef>(m, "TieredEmbeddingCache",
                          "Two-tier cache: L1 (device) + L2 (host), exclusive tiers, same get/put surface.\n"
                          "Safe to share across threads; callbacks may call back into the cache.")
      .def(py::init([](const py::object& l1, const py::object& l2, const py::object& device, const py::object& to_host,
                       const py::object& to_device) {
             auto cpu = [](const py::object& t) { return t.attr("cpu")(); };
             auto to = [device](const py::object& t) { return t.attr("to")(device); };
             return std::make_unique<PyTieredRef>(ToCacheBytes(l1, "capacity_bytes"),
                                                  ToCacheBytes(l2, "capacity_bytes"), WrapCopy(to_host, cpu),
                                                  WrapCopy(to_device, to));
           }),
           py::arg("l1_capacity_bytes"), py::arg("l2_capacity_bytes"), py::kw_only(), py::arg("device") = py::none(),
           py::arg("to_host") = py::none(), py::arg("to_device") = py::none())
      .def("get", &PyTieredRef::Get, py::arg("key"))
      .def("put", &PyTieredRef::Put, py::arg("key"), py::arg("value"), py::arg("nbytes"))
      .def("__contains__", &PyTieredRef::Contains)
      .def("__len__", [](PyTieredRef& c) { return c.Read([](const PyTiered& x) { return x.size(); }); })
      .def_property_readonly("l1", &PyTieredRef::l1, py::return_value_policy::reference_internal)
      .def_property_readonly("l2", &PyTieredRef::l2, py::return_value_policy::reference_internal)
      .def_property_readonly("hits", [](PyTieredRef& c) { return c.Read([](const PyTiered& x) { return x.hits(); }); })
      .def_property_readonly("l1_hits",
                             [](PyTieredRef& c) { return c.Read([](const PyTiered& x) { return x.l1_hits(); }); })
      .def_property_readonly("l2_hits",
                             [](PyTieredRef& c) { return c.Read([](const PyTiered& x) { return x.l2_hits(); }); })
      .def_property_readonly("misses",
                             [](PyTieredRef& c) { return c.Read([](const PyTiered& x) { return x.misses(); }); })
      .def_property_readonly("promotions",
                             [](PyTieredRef& c) { return c.Read([](const PyTiered& x) { return x.promotions(); }); })
      .def_property_readonly("demotions",
                             [](PyTieredRef& c) { return c.Read([](const PyTiered& x) { return x.demotions(); }); });

  py::class_<PendingEncodeItem>(m, "PendingEncodeItem",
                                "One vision item awaiting encode (frozen). cost is its vision-token count.")
      .def(py::init([](std::string request_id, const py::object& item_index, const py::object& cost) {
             return PendingEncodeItem{std::move(request_id), ToInt64(item_index, "item_index"), ToInt64(cost, "cost")};
           }),
           py::arg("request_id"), py::arg("item_index"), py::arg("cost"))
      .def_readonly("request_id", &PendingEncodeItem::request_id)
      .def_readonly("item_index", &PendingEncodeItem::item_index)
      .def_readonly("cost", &PendingEncodeItem::cost)
      .def_property_readonly("key",
                             [](const PendingEncodeItem& it) { return py::make_tuple(it.request_id, it.item_index); })
      .def("__eq__",
           [](const PendingEncodeItem& a, const py::object& b) -> py::object {
             if (!py::isinstance<PendingEncodeItem>(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
             return py::bool_(a == b.cast<const PendingEncodeItem&>());
           })
      .def("__hash__",
           [](const PendingEncodeItem& it) { return py::hash(py::make_tuple(it.request_id, it.item_index, it.cost)); })
      .def("__repr__", [](const PendingEncodeItem& it) {
        return "PendingEncodeItem(request_id=" + py::repr(py::str(it.request_id)).cast<std::string>() +
               ", item_index=" + std::to_string(it.item_index) + ", cost=" + std::to_string(it.cost) + ")";
      });

  py::class_<EncodeScheduler>(m, "EncodeScheduler",
                              "Deterministic patch-budget batcher. order='by_key' (the reference's "
                              "(request_id, item_index) order, default here) or 'fifo' (arrival order, "
                              "starvation-free).")
      .def(py::init([](const py::object& max_tokens, const py::object& max_items, const std::string& order) {
             return std::make_unique<EncodeScheduler>(ToInt64(max_tokens, "max_tokens_per_batch"),
                                                      ToInt64(max_items, "max_items_per_batch"), ParseOrder(order));
           }),
           py::arg("max_tokens_per_batch"), py::arg("max_items_per_batch"), py::kw_only(), py::arg("order") = "by_key")
      .def("add", &EncodeScheduler::Add, py::arg("item"), "Add, or overwrite the item under the same key.")
      .def("pending_size", &EncodeScheduler::pending_size)
      .def("next_batch", &EncodeScheduler::NextBatch,
           "Pop and return the next batch; empty only when nothing is pending.")
      .def(
          "remove",
          [](EncodeScheduler& s, const std::string& request_id, const py::object& item_index) {
            return s.Remove({request_id, ToInt64(item_index, "item_index")});
          },
          py::arg("request_id"), py::arg("item_index"))
      .def_property_readonly("max_tokens_per_batch", &EncodeScheduler::max_tokens_per_batch)
      .def_property_readonly("max_items_per_batch", &EncodeScheduler::max_items_per_batch)
      .def_property_readonly("order",
                             [](const EncodeScheduler& s) { return std::string(ScheduleOrderName(s.order())); });
}
