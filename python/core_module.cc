// epd._core: the Python drop-ins for the engine reference's cache and
// scheduler classes, over the C++ core.
//
// Keys and values are arbitrary Python objects. Keys hash and compare as a
// dict's do (hash(), then identity-or-==), so anything usable as a dict key in
// the reference is usable here, and an unhashable key raises the same
// TypeError. Values are kept alive by the cache (it holds a reference).
//
// Every call runs with the GIL held: values are Python objects, the hooks and
// copies are Python callables, and the C++ work per call is O(1), so releasing
// the GIL would cost more than it saves.
//
// Errors are translated here, once: epd::Error(kInvalidArgument) becomes
// ValueError with the same message as the reference; an exception raised by a
// Python callback (on_evict, to_host, to_device) propagates unchanged, and the
// cache is left in the state the reference leaves (see the C++ headers).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "epd/embedding_cache.h"
#include "epd/encode_scheduler.h"
#include "epd/status.h"
#include "epd/tiered_cache.h"

namespace py = pybind11;

namespace epd {

template <>
struct ValueTraits<py::object> {
  static bool IsNone(const py::object& v) { return v.is_none(); }
  static constexpr bool kNullCopyDrops = false;  // the reference stores what to_host returns
};

namespace {

struct PyHash {
  std::size_t operator()(const py::object& o) const { return static_cast<std::size_t>(py::hash(o)); }
};
struct PyEq {
  bool operator()(const py::object& a, const py::object& b) const { return a.is(b) || a.equal(b); }
};

using PyCache = EmbeddingCache<py::object, py::object, PyHash, PyEq>;
using PyTiered = TieredEmbeddingCache<py::object, py::object, PyHash, PyEq>;

PyCache::EvictHook WrapHook(const py::object& on_evict) {
  if (on_evict.is_none()) return nullptr;
  return [on_evict](const py::object& key, py::object&& value, std::int64_t nbytes) {
    on_evict(key, std::move(value), nbytes);
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

py::object PoppedToTuple(std::optional<PoppedEntry<py::object>> p) {
  if (!p.has_value()) return py::none();
  return py::make_tuple(std::move(p->value), p->nbytes);
}

ScheduleOrder ParseOrder(const std::string& order) {
  if (order == "by_key") return ScheduleOrder::kByKey;
  if (order == "fifo") return ScheduleOrder::kFifo;
  throw Error(StatusCode::kInvalidArgument, "order must be 'by_key' or 'fifo', got '" + order + "'");
}

}  // namespace
}  // namespace epd

PYBIND11_MODULE(_core, m) {
  using namespace epd;
  m.doc() = "C++ core of epd-encode: embedding caches and the encode scheduler.";

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

  py::class_<PyCache>(m, "EmbeddingCache",
                      "Bytes-bounded LRU cache of vision-tower outputs, keyed by content hash.\n\n"
                      "on_evict(key, value, nbytes) fires only for capacity-overflow victims, oldest first.")
      .def(py::init([](std::int64_t capacity_bytes, const py::object& on_evict) {
             return std::make_unique<PyCache>(capacity_bytes, WrapHook(on_evict));
           }),
           py::arg("capacity_bytes"), py::arg("on_evict") = py::none())
      .def(
          "get",
          [](PyCache& c, const py::object& key) -> py::object {
            std::optional<py::object> v = c.Get(key);
            return v.has_value() ? *v : py::none();
          },
          py::arg("key"), "The value (marked most recently used), or None on a miss.")
      .def("put", &PyCache::Put, py::arg("key"), py::arg("value"), py::arg("nbytes"),
           "Insert or replace as MRU, then evict LRU entries while over capacity.")
      .def(
          "pop", [](PyCache& c, const py::object& key) { return PoppedToTuple(c.Pop(key)); }, py::arg("key"),
          "Remove key and return (value, nbytes), or None. Counts no hit/miss and fires no hook.")
      .def("__contains__", &PyCache::Contains)
      .def("__len__", &PyCache::size)
      .def_property_readonly("capacity_bytes", &PyCache::capacity_bytes)
      .def_property_readonly("current_bytes", &PyCache::current_bytes)
      .def_property_readonly("hits", &PyCache::hits)
      .def_property_readonly("misses", &PyCache::misses)
      .def_property_readonly("evictions", &PyCache::evictions);

  py::class_<PyTiered>(m, "TieredEmbeddingCache",
                       "Two-tier cache: L1 (device) + L2 (host), exclusive tiers, same get/put surface.")
      .def(py::init([](std::int64_t l1, std::int64_t l2, const py::object& device, const py::object& to_host,
                       const py::object& to_device) {
             auto cpu = [](const py::object& t) { return t.attr("cpu")(); };
             auto to = [device](const py::object& t) { return t.attr("to")(device); };
             return std::make_unique<PyTiered>(l1, l2, WrapCopy(to_host, cpu), WrapCopy(to_device, to));
           }),
           py::arg("l1_capacity_bytes"), py::arg("l2_capacity_bytes"), py::kw_only(),
           py::arg("device") = py::none(), py::arg("to_host") = py::none(), py::arg("to_device") = py::none())
      .def(
          "get",
          [](PyTiered& c, const py::object& key) -> py::object {
            std::optional<py::object> v = c.Get(key);
            return v.has_value() ? *v : py::none();
          },
          py::arg("key"))
      .def("put", &PyTiered::Put, py::arg("key"), py::arg("value"), py::arg("nbytes"))
      .def("__contains__", &PyTiered::Contains)
      .def("__len__", &PyTiered::size)
      .def_property_readonly("l1", py::overload_cast<>(&PyTiered::l1), py::return_value_policy::reference_internal)
      .def_property_readonly("l2", py::overload_cast<>(&PyTiered::l2), py::return_value_policy::reference_internal)
      .def_property_readonly("hits", &PyTiered::hits)
      .def_property_readonly("l1_hits", &PyTiered::l1_hits)
      .def_property_readonly("l2_hits", &PyTiered::l2_hits)
      .def_property_readonly("misses", &PyTiered::misses)
      .def_property_readonly("promotions", &PyTiered::promotions)
      .def_property_readonly("demotions", &PyTiered::demotions);

  py::class_<PendingEncodeItem>(m, "PendingEncodeItem",
                                "One vision item awaiting encode (frozen). cost is its vision-token count.")
      .def(py::init([](std::string request_id, std::int64_t item_index, std::int64_t cost) {
             return PendingEncodeItem{std::move(request_id), item_index, cost};
           }),
           py::arg("request_id"), py::arg("item_index"), py::arg("cost"))
      .def_readonly("request_id", &PendingEncodeItem::request_id)
      .def_readonly("item_index", &PendingEncodeItem::item_index)
      .def_readonly("cost", &PendingEncodeItem::cost)
      .def_property_readonly("key", [](const PendingEncodeItem& it) { return py::make_tuple(it.request_id, it.item_index); })
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
      .def(py::init([](std::int64_t max_tokens, std::int64_t max_items, const std::string& order) {
             return std::make_unique<EncodeScheduler>(max_tokens, max_items, ParseOrder(order));
           }),
           py::arg("max_tokens_per_batch"), py::arg("max_items_per_batch"), py::kw_only(),
           py::arg("order") = "by_key")
      .def("add", &EncodeScheduler::Add, py::arg("item"), "Add, or overwrite the item under the same key.")
      .def("pending_size", &EncodeScheduler::pending_size)
      .def("next_batch", &EncodeScheduler::NextBatch,
           "Pop and return the next batch; empty only when nothing is pending.")
      .def(
          "remove",
          [](EncodeScheduler& s, const std::string& request_id, std::int64_t item_index) {
            return s.Remove({request_id, item_index});
          },
          py::arg("request_id"), py::arg("item_index"))
      .def_property_readonly("max_tokens_per_batch", &EncodeScheduler::max_tokens_per_batch)
      .def_property_readonly("max_items_per_batch", &EncodeScheduler::max_items_per_batch)
      .def_property_readonly("order", [](const EncodeScheduler& s) {
        return s.order() == ScheduleOrder::kByKey ? "by_key" : "fifo";
      });
}
