#!/usr/bin/env python3
"""End-to-end tests of `epd-encode plan` (pytest; the binary from EPD_ENCODE).

Expected values are computed here from the trace alone: a brute-force LRU
(a list in recency order) for the exact curve, and counts for the trivial
traces.
"""

import json
import os
import random
import subprocess

import pytest

EPD = os.environ.get("EPD_ENCODE")
SLOWER = float(os.environ.get("EPD_TEST_TIME_FACTOR", "1"))  # a sanitizer build's (cmake/epd_sanitizers.cmake)
pytestmark = pytest.mark.skipif(not EPD, reason="EPD_ENCODE not set (ctest plan_e2e sets it)")


def run(*args, env=None):
    return subprocess.run([EPD, "plan", *args], capture_output=True, text=True, env=env, timeout=300 * SLOWER)


def write(path, lines):
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    return str(path)


def lru_hits(trace, capacity):
    """Which accesses hit an LRU of `capacity` bytes (evict from the cold end until it fits)."""
    stack, used, hits = [], 0, []
    for key, nbytes, _ in trace:
        if key in [k for k, _ in stack]:
            i = [k for k, _ in stack].index(key)
            stack.append(stack.pop(i))
            hits.append(True)
            continue
        hits.append(False)
        if nbytes > capacity:
            continue
        stack.append((key, nbytes))
        used += nbytes
        while used > capacity:
            used -= stack.pop(0)[1]
    return hits


def test_malformed_trace_fails_naming_the_line(tmp_path):
    path = write(tmp_path / "t.jsonl", [{"key": "a", "bytes": 10, "cost_s": 0.1}, "", {"key": "b", "bytes": -3}])
    r = run("--trace", path)
    assert r.returncode == 1
    assert f"{path}:3: bytes must be an integer" in r.stderr
    r = run("--trace", write(tmp_path / "u.jsonl", [{"key": "a", "bytes": 1}, "{not json"]))
    assert r.returncode == 1 and "u.jsonl:2: not valid JSON" in r.stderr
    r = run("--trace", write(tmp_path / "v.jsonl", [{"key": "a", "bytes": 1, "cost_s": "slow"}]))
    assert r.returncode == 1 and "v.jsonl:1: cost_s must be a finite number >= 0" in r.stderr


@pytest.mark.parametrize("line", ['{"key":"a","bytes":007}', '{"key":"a","bytes":1,"cost_s":.5}',
                                  '{"key":"a","bytes":1,"cost_s":5.}', '{"key":"a","bytes":1,"cost_s":1e}'])
def test_numbers_json_does_not_allow_are_refused_naming_the_line(tmp_path, line):
    path = tmp_path / "t.jsonl"
    path.write_text('{"key":"ok","bytes":1}\n' + line + "\n")
    r = run("--trace", str(path))
    assert r.returncode == 1 and f"{path}:2: not valid JSON" in r.stderr, r.stderr


def test_the_parser_says_why_a_line_is_not_json_and_a_bom_only_starts_the_file(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"key":"ok","bytes":1}\n{"key":"a","bytes":1,"cost_s":1e400}\n')
    r = run("--trace", str(path))
    assert r.returncode == 1 and f"{path}:2: not valid JSON: number overflow" in r.stderr, r.stderr
    path.write_text('{"key":"ok","bytes":1}\n{"key":"a","bytes":1,"tenant":"x",}\n')
    r = run("--trace", str(path))
    # The parser's column, without its own "line 1", which is not the file's line.
    assert r.returncode == 1 and f"{path}:2: not valid JSON: parse error at column 35:" in r.stderr, r.stderr
    path.write_bytes(b'\xef\xbb\xbf{"key":"a","bytes":1}\n{"key":"a","bytes":1}\n')
    r = run("--trace", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["requests"] == 2
    path.write_bytes(b'\xef\xbb\xbf\n{"key":"a","bytes":1}\n')  # the BOM, then a blank line
    r = run("--trace", str(path), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["requests"] == 1, r.stderr
    path.write_bytes(b'{"key":"a","bytes":1}\n\xef\xbb\xbf{"key":"a","bytes":1}\n')
    r = run("--trace", str(path))
    assert r.returncode == 1 and f"{path}:2: a UTF-8 byte-order mark inside the file" in r.stderr, r.stderr


def test_only_a_regular_file_is_read_as_a_trace(tmp_path):
    # /dev/zero never ends and a FIFO without a writer never opens: both are refused before a byte is read.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in (("/dev/zero", "a character device"), (str(fifo), "a FIFO")):
        r = subprocess.run([EPD, "plan", "--trace", path], capture_output=True, text=True, timeout=30 * SLOWER)
        assert r.returncode == 1 and "not a regular file" in r.stderr and kind in r.stderr, (path, r.stderr)
    for path in (str(tmp_path), str(tmp_path / "missing.jsonl")):  # the flag's own check
        r = run("--trace", path)
        assert r.returncode != 0 and path in r.stderr, r.stderr


def test_a_plot_path_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    path = write(tmp_path / "t.jsonl", [{"key": "a", "bytes": 1}, {"key": "a", "bytes": 1}])
    for png, why in ((str(tmp_path / "no" / "such" / "dir.png"), "is not a directory"), (str(tmp_path), "is a directory")):
        r = run("--trace", path, "--plot", png)
        assert r.returncode == 1 and why in r.stderr and r.stdout == "", (png, r.stderr)


def test_model_and_images_given_with_a_cache_trace_are_said_to_be_ignored(tmp_path):
    path = write(tmp_path / "t.jsonl", [{"key": "a", "bytes": 1000, "cost_s": 0.5}] * 2)
    r = run("--trace", path, "--json", "--model", str(tmp_path), "--images", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "--model and --images (for a replay trace) are ignored" in r.stderr
    assert json.loads(r.stdout)["max_hit_ratio"]["seconds"] == 0.5
    assert "ignored" not in run("--trace", path, "--json").stderr


def test_an_error_escapes_control_characters_in_the_names_it_quotes(tmp_path):
    # A file name with a terminal escape sequence: the error names the file, escaped, and never writes the
    # raw escape character to the terminal.
    path = tmp_path / "bad\x1b[31m.jsonl"
    path.write_text('{"key":"a","bytes":-1}\n')
    r = run("--trace", str(path))
    assert r.returncode == 1 and "\x1b" not in r.stderr, repr(r.stderr)
    assert "bad\\x1b[31m.jsonl:1: bytes must be an integer" in r.stderr, repr(r.stderr)


def test_keys_are_checked_as_json_strings(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"key":"caf\xc3\xa9","bytes":1}\n{"key":"caf\xc3\xa9","bytes":1}\n')  # valid UTF-8: a repeat
    r = run("--trace", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["distinct_keys"] == 1
    path.write_bytes(b'{"key":"ok","bytes":1}\n{"key":"\xff\xfe","bytes":1}\n')  # not UTF-8
    r = run("--trace", str(path))
    assert r.returncode == 1 and f"{path}:2: not valid JSON" in r.stderr, r.stderr


def test_failed_manifest_items_are_skipped_and_counted_other_error_fields_are_not(tmp_path):
    lines = [{"request": "r1", "item": 0, "key": "a", "bytes": 100, "cost_s": 0.5, "source": "miss"},
             {"request": "r1", "item": 1, "media": "x.png", "error": "INVALID_ARGUMENT: item 1: not an image"},
             {"key": "a", "bytes": 100, "cost_s": 0.5, "error": None},
             {"key": "b", "bytes": 50, "cost_s": 0.25, "error": "timeout, then served"}]
    r = run("--trace", write(tmp_path / "m.jsonl", lines), "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["requests"] == 3 and j["distinct_keys"] == 2 and j["encode_seconds"] == pytest.approx(1.25)
    assert "skipped 1 failed item(s)" in r.stderr
    r = run("--trace", write(tmp_path / "n.jsonl", [{"key": "a", "bytes": "oops", "error": "x"}]))
    assert r.returncode == 1 and "n.jsonl:1: bytes must be an integer" in r.stderr


@pytest.mark.parametrize("number", ["0", "-0", "0.5", "1e5", "1E+5", "12.5e-3", "0e0"])
def test_every_json_number_form_is_read(tmp_path, number):
    path = tmp_path / "t.jsonl"
    path.write_text('{"key":"a","bytes":1,"cost_s":%s}\n' % number)
    r = run("--trace", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["encode_seconds"] == pytest.approx(max(0.0, float(number)))


def test_no_repeats_give_curves_flat_at_zero_hits(tmp_path):
    lines = [{"key": f"k{i}", "bytes": 1000 + i, "cost_s": 0.01} for i in range(500)]
    r = run("--trace", write(tmp_path / "t.jsonl", lines), "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["distinct_keys"] == 500
    assert j["max_hit_ratio"] == {"objects": 0.0, "bytes": 0.0, "seconds": 0.0}
    for c in j["curves"]:
        for p in c["points"]:
            assert p["miss_ratio"] == {"objects": 1.0, "bytes": 1.0, "seconds": 1.0}, c["label"]
    for row in j["sizing"]:
        assert row["reachable"] is False or row["bytes"]["total"] == 0


def test_exact_curve_matches_a_brute_force_lru_and_replay_matches_prediction(tmp_path):
    rng = random.Random(3)
    sizes = {f"k{i}": rng.randrange(100, 1000) for i in range(120)}
    trace = []
    for _ in range(4000):
        k = f"k{min(119, int(rng.paretovariate(1.2)) - 1)}" if rng.random() < 0.8 else f"k{rng.randrange(120)}"
        trace.append((k, sizes[k], sizes[k] * 1e-6 * (1 + (hash(k) % 7))))
    lines = [{"key": k, "bytes": b, "cost_s": c} for k, b, c in trace]
    r = run("--trace", write(tmp_path / "t.jsonl", lines), "--json", "--eviction", "lru", "--l1-max-gb", "0.00001",
            "--l2-max-gb", "0.00002")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["exact"] is True and j["requests"] == 4000
    lru = j["curves"][0]
    for p in lru["points"][::7]:
        cap = p["capacity_bytes"]
        hits = lru_hits(trace, int(cap))
        missed_seconds = sum(c for (_, _, c), h in zip(trace, hits) if not h)
        assert p["miss_ratio"]["seconds"] == pytest.approx(missed_seconds / sum(c for _, _, c in trace), abs=1e-9)
    for row in j["sizing"]:
        assert row["reachable"]
        pred, got = row["predicted_seconds_hit_ratio"]["all"], row["replayed_seconds_hit_ratio"]["all"]
        assert abs(pred - got) <= 0.02, row


def zipf_trace(n, keys, seed):
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** 0.9 for i in range(keys)]
    sizes = [rng.randrange(1000, 20000) for _ in range(keys)]
    picks = rng.choices(range(keys), weights=weights, k=n)
    return [{"key": f"k{i}", "bytes": sizes[i], "cost_s": sizes[i] * 1e-6 * (1 + i % 11)} for i in picks]


def without_timings(j):
    return {k: v for k, v in j.items() if k not in ("curves_s", "replay_s")}


def max_seconds_hit(lines):
    """The encode-seconds hit ratio of an infinite cache: every access but each key's first."""
    seen, hit = set(), 0.0
    for x in lines:
        hit += x["cost_s"] if x["key"] in seen else 0.0
        seen.add(x["key"])
    return hit / sum(x["cost_s"] for x in lines)


def knee_trace(keys, hot_cost):
    """Six passes of a loop over `keys` keys of 1 MB; with hot_cost > 0, after
    every second loop access one of 10 hot keys. Under GDSF the loop hits
    nothing until all of it fits: a step at the working set."""
    lines = []
    for p in range(6):
        for k in range(keys):
            lines.append({"key": f"loop{k}", "bytes": 1_000_000, "cost_s": 0.01})
            if hot_cost and k % 2 == 1:
                lines.append({"key": f"hot{(p * keys + k) // 2 % 10}", "bytes": 1_000_000, "cost_s": hot_cost})
    return lines


# The curve's 24 capacities bracket the step; the total read off it by
# interpolation is too small for 1,000 keys and the hot ones (the step sits
# near the bracket's top: the replay gets the hot keys' share only), and for
# 1,000 alone, and too large for 2,000 (the step near the bracket's bottom).
@pytest.mark.parametrize("keys,hot_cost", [(1000, 0.0167), (1000, 0), (2000, 0)])
def test_sizes_at_a_knee_reach_the_target_in_the_replay(tmp_path, keys, hot_cost):
    """The printed sizes give the share asked for in the full replay, and are
    the smallest that do to within 5 %."""
    lines = knee_trace(keys, hot_cost)
    working_set = (keys + (10 if hot_cost else 0)) * 1_000_000
    r = run("--trace", write(tmp_path / "knee.jsonl", lines), "--json", "--eviction", "gdsf", "--l1-max-gb", "0.1",
            "--l2-max-gb", "0.4", "--replay", "on")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    best = max_seconds_hit(lines)
    assert j["max_hit_ratio"]["seconds"] == pytest.approx(best, abs=1e-9)
    for row, target in zip(j["sizing"], (0.8, 0.9, 0.95)):
        assert row["reachable"]
        assert row["hit_ratio"] == pytest.approx(target * best, abs=1e-9)
        assert row["replayed_seconds_hit_ratio"]["all"] >= target * best - 0.005, row
        assert row["bytes"]["l1"] == pytest.approx(1e8) and row["bytes"]["l2"] == pytest.approx(4e8)
        # L3 is written through (it holds copies of L1's and L2's entries): it needs no more than the working
        # set as Redis charges it, and the loop hits only when most of it is held somewhere.
        assert j["working_set_bytes"] == working_set
        assert working_set < j["working_set_redis_bytes"] < 1.25 * working_set
        assert 0.5 * working_set <= row["bytes"]["l3"] <= 1.05 * j["working_set_redis_bytes"], row
        assert row["tiers_miniatures"] > 1 and row["reached"]  # the curve's total was moved
    totals = [row["bytes"]["total"] for row in j["sizing"]]
    assert totals == sorted(totals)  # a higher share never gets less


def test_thread_count_does_not_change_the_plan(tmp_path):
    # Above 200,000 requests and --exact-max: SHARDS, MiniSim at 5 % and the
    # tier miniatures, each run as its own task.
    path = write(tmp_path / "t.jsonl", zipf_trace(220_000, 30_000, 5))
    common = ("--trace", path, "--json", "--exact-max", "100000", "--replay", "on", "--l1-max-gb", "0.02",
              "--l2-max-gb", "0.1")
    one = run(*common, "--threads", "1")
    four = run(*common, "--threads", "4")
    assert one.returncode == 0 and four.returncode == 0, one.stderr + four.stderr
    a, b = json.loads(one.stdout), json.loads(four.stdout)
    assert a["exact"] is False and a["replayed"] is True
    assert without_timings(a) == without_timings(b)


def test_a_sample_too_small_is_warned_of_and_the_targets_stay_the_traces_own(tmp_path):
    # SHARDS with one key of sample: its curve ends far from the trace's
    # infinite-cache hit ratio. plan still counts that ratio exactly, sizes for
    # shares of it, and says the sample is too small.
    lines = zipf_trace(60_000, 40_000, 11)  # more keys than the 8,192 SHARDS keeps as the head
    path = write(tmp_path / "t.jsonl", lines)
    want = max_seconds_hit(lines)
    tiny = run("--trace", path, "--json", "--exact-max", "1000", "--shards-max-keys", "1")
    usual = run("--trace", path, "--json", "--exact-max", "1000")
    assert tiny.returncode == 0 and usual.returncode == 0, tiny.stderr + usual.stderr
    a, b = json.loads(tiny.stdout), json.loads(usual.stdout)
    assert a["exact"] is False and b["exact"] is False
    for j in (a, b):
        assert j["max_hit_ratio"]["seconds"] == pytest.approx(want, rel=1e-9)
        for row in j["sizing"]:
            assert row["hit_ratio"] == pytest.approx(row["target"] * want, rel=1e-9)
            assert row["reachable"], row
    assert len(a["warnings"]) == 1 and "raise --shards-max-keys or --shards-rate" in a["warnings"][0]
    assert a["sampler"]["sampled_keys"] < b["sampler"]["sampled_keys"]
    assert b["warnings"] == []
    text = run("--trace", path, "--exact-max", "1000", "--shards-max-keys", "1").stdout
    assert "warning: the SHARDS sample" in text


def test_a_minisim_sample_too_small_for_the_trace_is_warned_of(tmp_path):
    # Past 200,000 requests the GDSF curves come from MiniSim. At its default 5 % the GDSF curve's end (a cache that
    # holds the working set) sits within 0.01 of the trace's counted infinite-cache hit ratio; at 0.1 % it does not
    # (0.044 off when written), and plan says so.
    lines = zipf_trace(250_000, 60_000, 5)
    path = write(tmp_path / "t.jsonl", lines)
    want = max_seconds_hit(lines)
    for rate, warned in (("0.05", False), ("0.001", True)):
        j = json.loads(run("--trace", path, "--json", "--minisim-rate", rate, "--replay", "off").stdout)
        assert j["max_hit_ratio"]["seconds"] == pytest.approx(want, rel=1e-9)
        gdsf = next(c for c in j["curves"] if c["label"].startswith("gdsf ("))
        assert gdsf["points"][-1]["capacity_bytes"] >= j["working_set_bytes"]
        end = 1 - gdsf["points"][-1]["miss_ratio"]["seconds"]
        minisim = [w for w in j["warnings"] if w.startswith("the MiniSim sample")]
        assert (abs(end - want) > 0.01) == warned, (rate, end, want)
        assert len(minisim) == int(warned), j["warnings"]
        if warned:
            assert f"at {end:.3f}, the trace's is {want:.3f}" in minisim[0] and "raise --minisim-rate" in minisim[0]


def test_a_sampled_curve_flat_at_zero_still_gets_sizes_that_reach_the_target(tmp_path):
    # 90,000 one-off keys and four costly ones requested twice, 20,000 requests apart: a SHARDS sample of one
    # tail key holds none of the four, so its curve is flat at 0 while the trace's maximum is well above it.
    lines = [{"key": f"U{i}", "bytes": 1000, "cost_s": 0.01} for i in range(90_000)]
    for r in range(4):
        for at in (10_000 + 15_000 * r, 30_000 + 15_000 * r):
            lines.insert(at, {"key": f"R{r}", "bytes": 1000, "cost_s": 100})
    want = max_seconds_hit(lines)
    j = json.loads(run("--trace", write(tmp_path / "flat.jsonl", lines), "--json", "--eviction", "lru",
                       "--exact-max", "1000", "--shards-max-keys", "1", "--replay", "on").stdout)
    assert j["max_hit_ratio"]["seconds"] == pytest.approx(want, rel=1e-9) and want > 0.1
    assert any("SHARDS sample" in w for w in j["warnings"])
    for row in j["sizing"]:
        assert row["reached"], row
        assert row["replayed_seconds_hit_ratio"]["all"] >= row["hit_ratio"] - 0.005, row


def test_replay_auto_replays_only_traces_within_exact_max(tmp_path):
    path = write(tmp_path / "t.jsonl", zipf_trace(3000, 400, 7))
    sizes = ("--l1-max-gb", "0.0002", "--l2-max-gb", "0.001")
    auto = json.loads(run("--trace", path, "--json", *sizes).stdout)
    off = json.loads(run("--trace", path, "--json", *sizes, "--replay", "off").stdout)
    above = json.loads(run("--trace", path, "--json", *sizes, "--exact-max", "2999").stdout)
    forced = json.loads(run("--trace", path, "--json", *sizes, "--exact-max", "2999", "--replay", "on").stdout)
    assert auto["replayed"] is True and forced["replayed"] is True
    assert off["replayed"] is False and above["replayed"] is False
    for row in off["sizing"] + above["sizing"]:
        assert "replayed_seconds_hit_ratio" not in row and "replayed" not in row
    # The replay only checks: the curves and the predictions are the same without it.
    assert [r["predicted_seconds_hit_ratio"] for r in auto["sizing"]] == \
        [r["predicted_seconds_hit_ratio"] for r in off["sizing"]]
    assert auto["curves"] == off["curves"]
    # Replayed here: every request of the trace counted once, in some tier or as a miss.
    for row in auto["sizing"] + forced["sizing"]:
        if row["reachable"]:
            served = sum(row["replayed"][t]["objects"] for t in ("l1", "l2", "l3", "miss"))
            assert served == 3000
    text = run("--trace", path, *sizes, "--replay", "off").stdout
    assert "not replayed: --replay on checks the prediction" in text
    bad = run("--trace", path, "--replay", "sometimes")
    assert bad.returncode != 0 and "--replay" in bad.stderr


def test_plot_without_gnuplot_fails_with_a_clear_message(tmp_path):
    path = write(tmp_path / "t.jsonl", [{"key": "a", "bytes": 10}])
    env = dict(os.environ, PATH=str(tmp_path))  # no gnuplot there
    r = run("--trace", path, "--plot", str(tmp_path / "p.png"), env=env)
    assert r.returncode == 1
    assert "gnuplot" in r.stderr and "gnuplot-nox" in r.stderr
    assert not (tmp_path / "p.png").exists()


def test_plot_quotes_the_names_it_is_given(tmp_path):
    """A quote in the trace's or the PNG's name stays part of the name: gnuplot
    (a test dependency) draws the plot and runs nothing the name spells."""
    (tmp_path / "home").mkdir()
    trace = write(tmp_path / "t'; system 'cd; touch pwned'; x='.jsonl", [{"key": "a", "bytes": 10, "cost_s": 1}] * 3)
    png = tmp_path / "p'q.png"
    r = run("--trace", trace, "--plot", str(png), env=dict(os.environ, HOME=str(tmp_path / "home")))
    assert r.returncode == 0, r.stderr
    assert png.stat().st_size > 0
    assert not (tmp_path / "home" / "pwned").exists()
    r = run("--trace", trace, "--plot", str(tmp_path / "a\nb.png"))
    assert r.returncode == 1 and "--plot: a file name with a control character" in r.stderr


def test_a_nul_byte_is_refused_naming_its_line_not_read_as_the_line_end(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"key":"a","bytes":5}\n{"key":"a","bytes":5}\x00{"key":"b","bytes":999}\n')
    r = run("--trace", str(path))
    assert r.returncode == 1 and f"{path}:2: a NUL byte, which JSON text never holds" in r.stderr, r.stderr
    path.write_bytes(b'{"key":"a","bytes":5, "tenant":"x"}\x00junk\n')  # a line for the JSON parser
    r = run("--trace", str(path))
    assert r.returncode == 1 and f"{path}:1: a NUL byte" in r.stderr, r.stderr
    path.write_bytes(b'{"id":"r1","images":["a.png"]}\x00junk\n')  # a replay trace
    r = run("--trace", str(path), "--model", str(tmp_path))
    assert r.returncode == 1 and f"{path}:1: a NUL byte" in r.stderr, r.stderr


def test_plot_refuses_what_is_not_a_regular_file_and_replaces_a_stale_png(tmp_path):
    trace = write(tmp_path / "t.jsonl", [{"key": "a", "bytes": 10, "cost_s": 1}] * 3)
    fifo = tmp_path / "f.png"
    os.mkfifo(fifo)
    for target in (str(fifo), "/dev/full"):
        r = run("--trace", trace, "--plot", target)
        assert r.returncode == 1 and f"--plot: {target} exists and is not a regular file" in r.stderr, r.stderr
    png = tmp_path / "old.png"
    png.write_bytes(b"stale")
    r = run("--trace", trace, "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plan: drew the curves to {png}" in r.stderr


def test_huge_entries_and_costs_are_sized_or_refused_never_a_crash(tmp_path):
    # One entry of 10^18 bytes (near 2^62 - 1, the largest charge): the curve's capacities stay below it.
    r = run("--trace", write(tmp_path / "a.jsonl", [{"key": "a", "bytes": 10**18, "cost_s": 1}] * 2), "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["max_hit_ratio"]["seconds"] == pytest.approx(0.5)
    assert all(row["bytes"]["total"] <= 2**62 for row in j["sizing"])
    # Costs each finite whose sum is not: the line where the sum overflows is named.
    r = run("--trace", write(tmp_path / "b.jsonl", [{"key": "a", "bytes": 1, "cost_s": 1.7e308}] * 2))
    assert r.returncode == 1 and "b.jsonl:2: the encode seconds so far sum past the largest double" in r.stderr
    r = run("--trace", write(tmp_path / "c.jsonl", [{"key": "a", "bytes": 10**6}]), "--seconds-per-byte", "1e303")
    assert r.returncode == 1 and "c.jsonl:1:" in r.stderr
    r = run("--trace", write(tmp_path / "d.jsonl", [{"key": "a", "bytes": 1}]), "--window", str(2**27 + 1))
    assert r.returncode != 0 and "--window" in r.stderr
    # Distinct keys whose bytes sum past 2^62 - 1: the stack distances would
    # wrap their int64 sums (five keys of 2^61 read a miss ratio of 0.1 where
    # none can hit), so the trace is refused, naming the sum.
    e = write(tmp_path / "e.jsonl", [{"key": "abcde"[i % 5], "bytes": 2**61, "cost_s": 1} for i in range(50)])
    r = run("--trace", e, "--eviction", "lru")
    assert r.returncode == 1 and "the trace's distinct keys hold 1.153e+19 bytes, over the 2^62 - 1" in r.stderr, r.stderr
    # The bound is exact, not a double's: two keys of 2^61 (2^62) are refused,
    # two of 2^61 - 1 (2^62 - 2, which a double rounds to 2^62) are sized.
    r = run("--trace", write(tmp_path / "f.jsonl", [{"key": "ab"[i % 2], "bytes": 2**61, "cost_s": 1}
                                                    for i in range(10)]), "--eviction", "lru")
    assert r.returncode == 1 and "over the 2^62 - 1" in r.stderr, r.stderr
    r = run("--trace", write(tmp_path / "g.jsonl", [{"key": "ab"[i % 2], "bytes": 2**61 - 1, "cost_s": 1}
                                                    for i in range(10)]), "--json", "--eviction", "lru")
    assert r.returncode == 0, r.stderr


def test_a_trace_with_nothing_to_save_gets_no_cache(tmp_path):
    """Repeats that cost 0 s, and an empty trace: nothing to save, zero sizes, every curve at miss ratio 1."""
    for lines in ([{"key": f"k{i % 5}", "bytes": 1000, "cost_s": 0} for i in range(50)], []):
        r = run("--trace", write(tmp_path / "t.jsonl", lines), "--json")
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        assert j["max_hit_ratio"]["seconds"] == 0
        for row in j["sizing"]:
            assert row["hit_ratio"] == 0 and row["bytes"]["total"] == 0, row
        for c in j["curves"]:
            assert all(p["miss_ratio"]["seconds"] == 1 for p in c["points"]), c["label"]
        r = run("--trace", str(tmp_path / "t.jsonl"))
        assert "nothing to save" in r.stdout


def test_tiers_too_small_for_the_entries_place_them_as_the_worker_does(tmp_path):
    """With no L1 every entry goes straight to L2, as the worker places it
    (the L2-only rule); with neither L1 nor L2, straight to L3. The sizes
    still reach each share in the replay."""
    rng = random.Random(1)
    weights = [1 / (i + 1) ** 0.9 for i in range(300)]
    lines = [{"key": f"k{k}", "bytes": 10**6 + 1000 * k, "cost_s": 0.01}
             for k in rng.choices(range(300), weights, k=3000)]
    best = max_seconds_hit(lines)
    for limits in (("--l1-max-gb", "0"), ("--l1-max-gb", "0", "--l2-max-gb", "0")):
        r = run("--trace", write(tmp_path / "z.jsonl", lines), "--json", "--replay", "on", *limits)
        assert r.returncode == 0, r.stderr
        for row, target in zip(json.loads(r.stdout)["sizing"], (0.8, 0.9, 0.95)):
            assert row["reached"], row
            assert row["replayed_seconds_hit_ratio"]["all"] >= target * best - 0.005, (limits, row)


def test_the_doorkeeper_gates_l1_alone_so_its_plan_is_sized_as_the_tiers_reach(tmp_path):
    # A loop of 1,000 one-megabyte keys with 50 hot keys beside it. The doorkeeper keeps first requests out
    # of L1 only (they go into L2), so the total is sized off GDSF's curve, not off the GDSF + doorkeeper
    # curve of one cache that refuses them (sized off that, the plan came out several times too big).
    lines = []
    for _ in range(10):
        for i in range(1000):
            lines.append({"key": f"L{i}", "bytes": 10**6, "cost_s": 0.01})
            if i % 5 == 0:
                lines.append({"key": f"H{i % 50}", "bytes": 10**6, "cost_s": 0.01})
    path = write(tmp_path / "h.jsonl", lines)
    want = max_seconds_hit(lines)
    common = ("--trace", path, "--json", "--replay", "on", "--l1-max-gb", "0.02", "--l2-max-gb", "0.2")
    plain, dk = (json.loads(run(*common, *extra).stdout) for extra in ((), ("--l1-admission", "doorkeeper")))
    assert dk["policy"] == "gdsf+doorkeeper"
    for row, base in zip(dk["sizing"], plain["sizing"]):
        assert row["reachable"] and row["hit_ratio"] == pytest.approx(row["target"] * want, rel=1e-9)
        got = row["replayed_seconds_hit_ratio"]["all"]
        assert row["reached"] == (got >= row["hit_ratio"] - 0.005), row  # rate 1: the miniature is the replay
        # Every request but a key's first, at most; the loop needs all 1,000 keys held to hit at all.
        assert got <= want + 1e-12
        assert row["bytes"]["total"] <= 2 * base["bytes"]["total"], (row["bytes"], base["bytes"])
    totals = [row["bytes"]["total"] for row in dk["sizing"]]
    assert totals == sorted(totals)
    text = run(*[a for a in common if a != "--json"], "--l1-admission", "doorkeeper").stdout
    assert ("short: no total up to" in text) == (not all(row["reached"] for row in dk["sizing"]))
    # A window of one request admits nothing to L1 (a key never repeats within it): the plan says so.
    assert not any(w.startswith("L1 ") for w in dk["warnings"] + plain["warnings"])
    one = json.loads(run(*common, "--l1-admission", "doorkeeper", "--window", "1").stdout)
    assert all(row["predicted_seconds_hit_ratio"]["l1"] == 0 for row in one["sizing"])
    assert any("a key enters L1 on its second request within 1 requests" in w for w in one["warnings"]), one["warnings"]


def test_a_doorkeeper_plan_under_the_l1_limit_keeps_an_l2_for_first_requests(tmp_path):
    # Every key requested twice, 1,000 keys of 1 MB: under the default 16 GB L1 limit. The doorkeeper sends a
    # first request to L2 only, so a plan with all of it in L1 and no L2 would drop every first request and
    # hit nothing.
    lines = [{"key": f"k{i}", "bytes": 10**6, "cost_s": 0.01} for _ in range(2) for i in range(1000)]
    j = json.loads(run("--trace", write(tmp_path / "twice.jsonl", lines), "--json", "--replay", "on",
                       "--l1-admission", "doorkeeper").stdout)
    for row in j["sizing"]:
        b = row["bytes"]
        assert b["l2"] >= b["l1"] > 0, b
        assert row["reached"] and row["replayed_seconds_hit_ratio"]["all"] >= row["hit_ratio"] - 0.005, row


def test_replay_trace_without_model_says_what_to_give(tmp_path):
    path = write(tmp_path / "t.jsonl", [{"id": "r1", "images": ["a.png"]}])
    r = run("--trace", path)
    assert r.returncode == 1
    assert "is a replay trace" in r.stderr and "--model" in r.stderr


@pytest.mark.parametrize("admission", ["none", "doorkeeper"])
def test_each_row_names_the_worker_flags_that_run_its_sizes(tmp_path, admission):
    # 40 keys of 3,000,001 bytes, each requested 3 times, in a loop: a cache
    # of any size between 1 key and all 40 hits some, so the rows differ.
    trace = [{"key": f"k{i % 40}", "bytes": 3_000_001, "cost_s": 0.01 * (1 + i % 7)} for i in range(120)]
    path = write(tmp_path / "t.jsonl", trace)
    r = run("--trace", path, "--json", "--eviction", "adaptive", "--l1-admission", admission, "--window", "77",
            "--l1-max-gb", "0.05", "--l2-max-gb", "0.07")
    assert r.returncode == 0, r.stderr
    serve_help = subprocess.run([EPD, "serve", "--help"], capture_output=True, text=True, timeout=60 * SLOWER).stdout
    rows = [x for x in json.loads(r.stdout)["sizing"] if x["reachable"]]
    assert rows
    for row in rows:
        args = row["serve_args"].split()
        flags = dict(zip(args[::2], args[1::2]))
        assert len(args) == 2 * len(flags), args
        assert all(f"{name} " in serve_help for name in flags), (flags, "not all in serve --help")
        assert flags["--eviction"] == "adaptive"
        if admission == "doorkeeper":
            assert flags["--l1-admission"] == "doorkeeper" and flags["--l1-admission-window"] == "77"
        else:
            assert "--l1-admission" not in flags and "--l1-admission-window" not in flags
        # The worker counts MiB: the whole MiB at or above the row's bytes.
        for flag, tier in (("--cache-mb", "l1"), ("--host-cache-mb", "l2")):
            mib = int(flags[flag])
            nbytes = row["bytes"][tier]
            assert mib * 2**20 >= nbytes and (mib - 1) * 2**20 < max(nbytes, 1), (flag, mib, nbytes)
    text = run("--trace", path, "--eviction", "adaptive", "--l1-admission", admission, "--window", "77",
               "--l1-max-gb", "0.05", "--l2-max-gb", "0.07")
    assert text.returncode == 0, text.stderr
    for row in rows:
        assert row["serve_args"] in text.stdout
    # A window past the trace's 120 requests is modelled as 120 (it never ends
    # within the trace), but the server runs on past it: the flag keeps it.
    r = run("--trace", path, "--json", "--l1-admission", admission, "--window", "65536")
    assert r.returncode == 0, r.stderr
    for row in json.loads(r.stdout)["sizing"]:
        assert ("--l1-admission-window 65536" in row["serve_args"]) == (admission == "doorkeeper"), row
