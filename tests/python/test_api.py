"""The drop-in surface of `epd`, without the reference: signatures, keywords,
defaults, errors, frozen items, and the issue's named regression cases."""

import dataclasses
import gc
import inspect
import weakref

import pytest

import epd
from project_info import project_version


def test_version_is_the_cmake_projects():
    assert epd.__version__ == project_version()
    assert "__version__" in epd.__all__


def test_import_exposes_the_reference_class_names():
    for name in ("EmbeddingCache", "TieredEmbeddingCache", "EncodeScheduler", "PendingEncodeItem"):
        assert hasattr(epd, name)


def test_cache_single_tier_regression():
    evicted = []
    c = epd.EmbeddingCache(250, on_evict=lambda k, v, n: evicted.append((k, v, n)))
    c.put("a", "A", 100)
    c.put("b", "B", 100)
    assert c.get("a") == "A"
    c.put("c", "C", 100)
    assert "b" not in c and "a" in c and "c" in c
    assert c.current_bytes == 200
    assert evicted == [("b", "B", 100)]


def test_cache_hook_order_regression():
    evicted = []
    c = epd.EmbeddingCache(capacity_bytes=200, on_evict=lambda k, v, n: evicted.append(k))
    c.put("a", 1, 100)
    c.put("b", 2, 100)
    c.put("b", 3, 100)  # re-put never fires the hook
    assert evicted == []
    c.put("c", 4, 100)
    c.put("a", 5, 100)
    assert evicted == ["a", "b"]
    assert "a" in c and "c" in c and c.current_bytes == 200


def test_tiered_regression():
    t = epd.TieredEmbeddingCache(200, 200, to_host=lambda v: v, to_device=lambda v: v)
    for k in "abc":
        t.put(k, k.upper(), 100)
    assert ("b" in t.l1, "c" in t.l1, "a" in t.l2, "a" in t.l1) == (True, True, True, False)
    assert t.get("a") == "A"
    assert ("c" in t.l1, "a" in t.l1, "b" in t.l2, "b" in t.l1) == (True, True, True, False)
    assert (t.hits, t.l1_hits, t.l2_hits, t.misses, t.promotions, t.demotions) == (1, 0, 1, 0, 1, 2)
    assert len(t) == 3


def test_scheduler_regression():
    s = epd.EncodeScheduler(1000, 4)
    s.add(epd.PendingEncodeItem("big", 0, 1200))
    s.add(epd.PendingEncodeItem("small", 0, 100))
    assert [i.request_id for i in s.next_batch()] == ["big"]
    assert [i.request_id for i in s.next_batch()] == ["small"]
    assert s.next_batch() == []


def test_miss_returns_none_and_pop_returns_tuple():
    c = epd.EmbeddingCache(100)
    assert c.get("x") is None
    c.put("x", [1, 2], 10)
    assert c.pop("x") == ([1, 2], 10)
    assert c.pop("x") is None
    assert (c.hits, c.misses) == (0, 1)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: epd.EmbeddingCache(-1), "capacity_bytes must be >= 0, got -1"),
        (lambda: epd.EmbeddingCache(10).put("k", 1, -3), "nbytes must be >= 0, got -3"),
        (lambda: epd.TieredEmbeddingCache(10, -2), "capacity_bytes must be >= 0, got -2"),
        (lambda: epd.EncodeScheduler(0, 1), "max_tokens_per_batch must be > 0, got 0"),
        (lambda: epd.EncodeScheduler(1, 0), "max_items_per_batch must be > 0, got 0"),
        (lambda: epd.EncodeScheduler(1, 1, order="lifo"), "order must be 'by_key' or 'fifo'"),
    ],
)
def test_value_errors_name_the_argument(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make()


def test_unhashable_key_raises_type_error_like_a_dict():
    c = epd.EmbeddingCache(100)
    with pytest.raises(TypeError):
        c.put(["list"], 1, 1)
    assert len(c) == 0


def test_values_are_kept_alive_by_the_cache():
    class Value:
        pass

    c = epd.EmbeddingCache(100)
    v = Value()
    ref = weakref.ref(v)
    c.put("k", v, 10)
    del v
    gc.collect()
    assert ref() is not None
    c.pop("k")
    gc.collect()
    assert ref() is None


def test_raising_hook_propagates_and_victim_is_gone():
    def boom(k, v, n):
        raise KeyError(k)

    c = epd.EmbeddingCache(100, on_evict=boom)
    c.put("a", 1, 100)
    with pytest.raises(KeyError):
        c.put("b", 2, 100)
    assert "a" not in c and "b" in c and c.current_bytes == 100


def test_pending_item_is_frozen_with_key():
    item = epd.PendingEncodeItem(request_id="r", item_index=2, cost=7)
    assert item.key == ("r", 2)
    assert item == epd.PendingEncodeItem("r", 2, 7)
    assert hash(item) == hash(epd.PendingEncodeItem("r", 2, 7))
    assert repr(item) == "PendingEncodeItem(request_id='r', item_index=2, cost=7)"
    with pytest.raises(AttributeError):
        item.cost = 3


def test_keyword_names_match_the_reference_signatures():
    epd.EmbeddingCache(capacity_bytes=1, on_evict=None)
    epd.TieredEmbeddingCache(l1_capacity_bytes=1, l2_capacity_bytes=1, device=None, to_host=None, to_device=None)
    epd.EncodeScheduler(max_tokens_per_batch=1, max_items_per_batch=1)
    with pytest.raises(TypeError):
        epd.TieredEmbeddingCache(1, 1, None)  # device is keyword-only, as in the reference


def test_fifo_order_is_available_and_starvation_free():
    s = epd.EncodeScheduler(100, 1, order="fifo")
    s.add(epd.PendingEncodeItem("zzz", 0, 100))
    s.add(epd.PendingEncodeItem("aaa", 0, 100))
    assert s.next_batch()[0].request_id == "zzz"
    assert s.order == "fifo"
    assert epd.EncodeScheduler(1, 1).order == "by_key"
