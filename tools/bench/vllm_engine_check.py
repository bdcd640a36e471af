"""`python -m tools.bench vllm --self-check`: the vLLM bench's harness
checked without vLLM: the Semantic IDs it generates, the membership check
that fails a row, the supervisor's time limits (a hung row is killed with its
whole process group and reported, the rows after it are not run; a child that
dies is reported) and the table and target lines. Prints one line per check
("ok" or "FAIL") and returns 1 when any fails."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from tools.bench import vllm_engine as bench
from tools.bench.cli import run_checks


class CheckFailed(AssertionError):
    pass


def _expect(cond, message: str):
    if not cond:
        raise CheckFailed(message)


def check_semantic_ids():
    sids = bench.semantic_ids(5000)
    _expect(sids.shape == (5000, 4) and (sids[:, -1] == bench.EOS).all(), f"shape {sids.shape}")
    _expect(int(sids[:, :-1].min()) >= bench.SID_OFFSET and int(sids.max()) < 512, "ids >= 512")
    keys = {bench.sid_key(row) for row in sids.tolist()}
    _expect(len(keys) == 5000 and -1 not in keys, "keys not distinct")
    row = sids[0].tolist()
    for wrong in (row[:-1], row[:-1] + [7], [row[1]] + row[1:], row + [bench.EOS]):
        _expect(bench.sid_key(wrong) == -1, f"{wrong} read as a Semantic ID")
    _expect((bench.semantic_ids(5000) == sids).all(), "not deterministic")
    return "5000 distinct, ids in [3, 512), end token last"


def check_membership_fails_what_it_should():
    names = {"Karito 12", "Ne Sa"}
    good = [("Karito 12", [5, 6, 1], "stop"), ("Ne Sa", [7, 1], "stop")]
    _expect(bench.non_members(good, "names", names) == [], "members rejected")
    for bad in (("Karito 1", [5, 1], "stop"),          # not a name
                ("Karito 12", [5, 6, 9], "length")):   # cut before its end token
        _expect(len(bench.non_members(good + [bad], "names", names)) == 1, f"{bad} accepted")
    sids = bench.semantic_ids(10)
    members = {bench.sid_key(r) for r in sids.tolist()}
    outside = next(r for r in bench.semantic_ids(200).tolist() if bench.sid_key(r) not in members)
    got = bench.non_members([("", sids[0].tolist(), "stop"), ("", outside, "stop")], "sids",
                            members)
    _expect(got == [("", outside, "stop")], f"sids: {got}")
    errored = ("K", [5], "error")                         # the engine ended it: not an output
    _expect(bench.non_members(good + [errored], "names", names) == [], "an error counted")
    return "a non-member, a cut name and a Semantic ID outside the set each fail"


FAKE_CHILD = r"""
import json, subprocess, sys, time
E = sys.argv[1]
def emit(event, **kw): print(E + json.dumps({"event": event, **kw}), flush=True)
print("some engine log line", flush=True)
emit("engine", seconds=0.1)
emit("start", key="a"); emit("row", key="a", tokens_per_s=1.0)
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("grandchild", grandchild.pid, flush=True)
emit("start", key="b")
emit("first", key="b", seconds=0.25)
if sys.argv[2] == "hang":
    time.sleep(60)
sys.exit(3)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:   # a zombie is dead
        return fh.read().split(") ")[1][0] != "Z"


def check_supervisor_limits():
    with tempfile.TemporaryDirectory() as tmp:
        log_path = os.path.join(tmp, "log")
        outcomes = {}
        for mode in ("hang", "die"):
            with open(log_path, "w") as log:
                start = time.monotonic()
                outcomes[mode] = bench.supervise(
                    [sys.executable, "-c", FAKE_CHILD, bench.EVENT, mode], ["a", "b", "c"],
                    engine_limit=30, row_limit=1.5, log=log)
                outcomes[mode]["seconds"] = time.monotonic() - start
            text = open(log_path).read()
            _expect("some engine log line" in text and bench.EVENT not in text, "log lines")
            pid = int(text.split("grandchild ")[1].split()[0])
            deadline = time.monotonic() + 5
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            _expect(not _alive(pid), f"{mode}: the child's process group was not killed")
    hang, die = outcomes["hang"], outcomes["die"]
    _expect(hang["a"]["tokens_per_s"] == 1.0 and hang["engine_s"] == 0.1, json.dumps(hang))
    _expect(hang["b"]["error"] == "timed out after 2 s (its first request answered in 0.2 s)",
            hang["b"])
    _expect(hang["c"]["error"] == "not run: b timed out", hang["c"])
    _expect(hang["seconds"] < 20, f"took {hang['seconds']:.1f} s")
    _expect(die["b"]["error"].startswith("the engine's process exited with status 3"), die["b"])
    _expect(die["c"]["error"] == "not run: the engine's process ended first", die["c"])
    return "a hung row timed out (group killed), a dead child reported, later rows not run"


def _result(tokens_per_s, not_members=0):
    return {"first_s": 0.5, "again_s": 0.1, "tokens_per_s": tokens_per_s, "ttft_ms": 9.0,
            "tpot_ms": 3.0,
            "tokens_per_request": 7.0, "checked": 10, "not_members": not_members,
            "example": [["Nope", [5, 1], "stop"]] if not_members else []}


def check_table_and_targets():
    args = bench.parse_args(["--names", "1e5", "--sids"])
    artifacts = {("names", 10 ** 5): {"compile_s": 1.0, "save_s": 0.5, "load_s": 0.2,
                                      "path": "x"}}
    engines = [("static", [{"key": "names 1e5 static", "catalogue": "names", "size": 10 ** 5,
                            "method": "static"},
                           {"key": "names 1e5 unconstrained", "catalogue": "names",
                            "size": 10 ** 5, "method": "unconstrained"}]),
               ("guidance", [{"key": "names 1e5 guidance", "catalogue": "names", "size": 10 ** 5,
                              "method": "guidance"}])]
    results = {"static": {"engine_s": 30.0, "names 1e5 static": _result(95.0),
                          "names 1e5 unconstrained": _result(100.0)},
               "guidance": {"engine_s": 31.0,
                            "names 1e5 guidance": {"error": "timed out after 120 s"}}}
    text, failed = bench.table(args, artifacts, engines, results)
    _expect(not failed and "| names | 1e5 | static | 30.0 | 1.50 | 0.50 | 0.10 | 95 | 0.95x | 9.0 | 3.0 | 7.0 |"
            in text, text)
    _expect("| guidance | 31.0 | - | timed out after 120 s | | | | | | | | |" in text, text)
    lines = bench.targets(args, results, artifacts)
    _expect("+5.0% (met)" in lines[0], lines)
    results["static"]["names 1e5 static"] = _result(80.0, not_members=1)
    text, failed = bench.table(args, artifacts, engines, results)
    _expect(failed and "FAILED: 1 of 10 not members, e.g. 'Nope' (tokens [5, 1], "
            "finish_reason 'stop')" in text, text)
    _expect("+20.0% (missed)" in bench.targets(args, results, artifacts)[0], "a 20% cost was met")
    results["guidance"]["names 1e5 guidance"] = dict(
        _result(3.0), checked=0, errors=10, log_errors=[
            "(EngineCore pid=7) WARNING 12-06 [backend_guidance.py:231] LLMatcher error: Parser "
            "Error: Current row has 10001 items; max is 2000"])
    results["static"]["names 1e5 static"] = _result(95.0)
    text, failed = bench.table(args, artifacts, engines, results)
    _expect(not failed and "engine error: 10 of 10 requests ended with finish_reason 'error' "
            "(LLMatcher error: Parser Error: Current row has 10001 items; max is 2000); "
            "0 members |" in text, text)
    return "ratios, timeouts, engine errors, a failed membership and a missed target printed"


def all_checks() -> list:
    return [("semantic ids", check_semantic_ids),
            ("membership", check_membership_fails_what_it_should),
            ("supervisor time limits", check_supervisor_limits),
            ("table and targets", check_table_and_targets)]


def main() -> int:
    return run_checks(all_checks(), "[bench vllm] self-check")
