"""Peers, measured: the task "the LLM must emit one of N names" for this
library, xgrammar, llguidance, outlines-core and Hugging Face's
``prefix_allowed_tokens_fn`` over a Python dict trie, on the same tokenizer,
names and checks in one run.

The work, the same for every engine:

* a byte-level BPE tokenizer trained here with ``tokenizers`` on the Python
  standard library's source files (``--vocab``, default 16384);
* catalogues of N names (``--items``): real names first (Unicode character
  names from `unicodedata`, the algorithmic ``...-XXXX`` ones left out, and
  IANA time zones from `zoneinfo`, in a seeded order), then deterministic
  product-like names ("Vantor Compact Kettle 240");
* each engine gets the catalogue in its natural form: us, the names and the
  tokenizer (`compile_constraints(names, tokenizer=...)`); xgrammar, an EBNF
  alternation of string literals; llguidance and outlines-core, a regex
  alternation of the escaped names; the dict trie, the names' token ids.

Per engine and N, in a fresh child process (``--timeout`` each):

* import s: importing the engine's modules (jax and the library for us, and
  starting the XLA client; the engine, and transformers where it adapts
  the tokenizer through it), timed apart: a server pays it once, not per
  catalogue;
* compile s: from names to something that masks (tokenizing included), the
  modules already imported;
* RSS MB: the compile's peak resident memory over the child's before it
  (VmHWM after, the peak reset through /proc/self/clear_refs, minus VmRSS
  before);
* mask ms @1 / @70: one decoding step of 1 and of 70 sequences, each
  advancing along a real name (teacher-forced): from float32 logits in to
  masked logits out, and the matchers advanced. Peers fill their token
  bitmask for each sequence (their batch call where they have one), the
  bitmask is applied with numpy, and each matcher takes its token; the dict
  trie is HF's `PrefixConstrainedLogitsProcessor`; we run
  `compiled.processor(rows)` (`mask`, then `advance`: one jitted program
  per step each, passed only that step's tables) on jax arrays;
  ``--old-path`` also times, interleaved, the earlier way (the pair jitted
  per step with every step's tables as arguments, dense mask). Median over repeats of
  the mean step, after a warm-up walk;
* beam step ms (us only): `beam_search` with 70 beams over a stand-in model
  (a table of logits), total / max_length, median over repeats;
* exact: 1,000 names accepted (every token allowed in turn, then the end
  token) and 1,000 near misses (a name with one character changed, one to
  three dropped, or one added; none of them a name) rejected;
* non-canonical: does the engine accept a name spelled one byte token per
  byte (its tokenization is not the tokenizer's)? Ours ("static") holds the
  tokenizer's spelling only; "static-any" is us with ``spellings="any"``
  (every tokenization of a name, up to N = 1e5: `MAX_ITEMS`); grammar
  engines accept any tokenization of the text.

    python -m tools.bench peers --quick                  # N = 1e3, 1e4, V = 8192
    python -m tools.bench peers                          # N = 1e3 .. 1e6, V = 16384
    python -m tools.bench peers --items 1e5 --engines static xgrammar --out peers.md
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unicodedata
import zoneinfo

import numpy as np

from tools.bench.cli import exit_without_teardown

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ENGINES = ("static", "static-any", "xgrammar", "llguidance", "outlines-core", "hf-dict-trie")
ENGINE_PACKAGES = {"static": ("jax", "static-compiler"), "static-any": ("jax", "static-compiler"),
                   "xgrammar": ("xgrammar", "xgrammar"),
                   "llguidance": ("llguidance", "llguidance"),
                   "outlines-core": ("outlines_core", "outlines_core"),
                   "hf-dict-trie": ("transformers", "transformers")}
"""engine -> (module to import, distribution whose version is reported)."""
MAX_ITEMS = {"static-any": 10 ** 5}
"""engine -> the largest N it runs at: us with ``spellings="any"`` (every
tokenization of a name, laid out by depth) compiled 2.56M states in 33.6 s
and 1.0 GB at 1e5 names in this bench; larger N is reported as skipped."""

EOS = "<|endoftext|>"
CHECKS = 1000
NON_CANONICAL = 100
PROMPT_LENGTH = 4
MAX_WALK_STEPS = 8
"""Timed steps per walk (the default of --walk-steps): the first steps of the
names (where sets branch)."""

_ALGORITHMIC = re.compile(r"-[0-9A-F]{4,6}$")
BRANDS = ("Acme", "Vantor", "Kelda", "Orbis", "Norrow", "Lumen", "Pellar", "Quill", "Ravel",
          "Sorrel", "Tamsin", "Umbra", "Veldt", "Wexley", "Yarrow", "Zephyr", "Brisk", "Calder",
          "Dunmore", "Everly", "Fenwick", "Galen", "Harrow", "Ivers", "Jessop", "Kestrel",
          "Larkin", "Marlow", "Nettle", "Osprey")
ADJECTIVES = ("Compact", "Deluxe", "Classic", "Pro", "Ultra", "Mini", "Max", "Smart", "Eco",
              "Rapid", "Silent", "Heavy Duty", "Portable", "Wireless", "Digital", "Cordless",
              "Premium", "Essential", "Advanced", "Urban", "Outdoor", "Indoor", "Folding",
              "Stainless", "Ceramic", "Bamboo", "Carbon", "Titanium", "Vintage", "Modern",
              "Slim", "Twin", "Quad", "Solar", "Thermal", "Hybrid", "Studio", "Travel", "Kids",
              "Family", "Junior", "Senior", "Night", "Day", "Arctic", "Desert", "Coastal",
              "Alpine", "Metro", "Rustic")
NOUNS = ("Kettle", "Toaster", "Blender", "Lamp", "Chair", "Desk", "Backpack", "Jacket", "Boot",
         "Headphones", "Speaker", "Monitor", "Keyboard", "Mouse", "Router", "Drill", "Saw",
         "Tent", "Stove", "Bottle", "Mug", "Pan", "Knife", "Grill", "Fan", "Heater", "Mixer",
         "Camera", "Tripod", "Scooter", "Bicycle", "Helmet", "Watch", "Charger", "Cable",
         "Tablet", "Printer", "Scanner", "Projector", "Vacuum", "Humidifier", "Purifier",
         "Sofa", "Mattress", "Pillow", "Blanket", "Rug", "Shelf", "Cabinet", "Mirror")


# ---------------------------------------------------------------- the work


def real_names(seed: int = 0) -> list:
    """Unicode character names (no algorithmic ``...-XXXX`` ones) and IANA
    time zones, distinct, in a seeded order."""
    names = {unicodedata.name(chr(c), "") for c in range(0x110000)}
    names = {n for n in names if n and not _ALGORITHMIC.search(n)}
    names |= set(zoneinfo.available_timezones())
    names = sorted(names)
    order = np.random.default_rng(seed).permutation(len(names))
    return [names[i] for i in order]


def product_names(count: int, seed: int = 0, exclude=frozenset()) -> list:
    """`count` distinct product-like names ("Vantor Compact Kettle 240"),
    deterministic in `seed`: an affine bijection of [0, M) picks the
    (brand, adjective, noun, number) combinations, so none repeats."""
    space = len(BRANDS) * len(ADJECTIVES) * len(NOUNS) * 999
    if count > space:
        raise ValueError(f"at most {space} product names")
    rng = np.random.default_rng(seed + 1)
    mult = int(rng.integers(space // 3, space))
    while np.gcd(mult, space) != 1:
        mult += 1
    shift = int(rng.integers(space))
    out, i = [], 0
    while len(out) < count:
        k = (i * mult + shift) % space
        i += 1
        k, num = divmod(k, 999)
        k, noun = divmod(k, len(NOUNS))
        brand, adj = divmod(k, len(ADJECTIVES))
        name = f"{BRANDS[brand]} {ADJECTIVES[adj]} {NOUNS[noun]} {num + 1}"
        if name not in exclude:
            out.append(name)
    return out


def catalogue(n: int, seed: int = 0) -> list:
    """N distinct names: the real ones first, then product-like ones."""
    real = real_names(seed)
    if n <= len(real):
        return real[:n]
    return real + product_names(n - len(real), seed, exclude=frozenset(real))


def near_misses(names: list, count: int, seed: int = 0) -> list:
    """`count` strings that are not names, each a name with one character
    changed, one to three dropped from its end, or one added (deterministic
    in `seed`)."""
    rng = np.random.default_rng(seed + 2)
    taken = set(names)
    alphabet = sorted(set("".join(names[:10000])) | set("ABCXYZ019 -"))
    out, seen = [], set()
    while len(out) < count:
        name = names[int(rng.integers(len(names)))]
        op = int(rng.integers(3))
        if op == 0:
            p = int(rng.integers(len(name)))
            c = alphabet[int(rng.integers(len(alphabet)))]
            miss = name[:p] + c + name[p + 1:]
        elif op == 1:
            miss = name[:-int(rng.integers(1, 4))]
        else:
            miss = name + alphabet[int(rng.integers(len(alphabet)))]
        if miss and miss not in taken and miss not in seen:
            seen.add(miss)
            out.append(miss)
    return out


def training_text(limit_bytes: int) -> list:
    """The standard library's .py files (sorted), up to `limit_bytes`."""
    import sysconfig
    stdlib = sysconfig.get_paths()["stdlib"]
    texts, total = [], 0
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "test", "tests",
                                                              "idlelib", "__pycache__"))
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            try:
                with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                    text = fh.read()
            except (OSError, UnicodeDecodeError):
                continue
            texts.append(text)
            total += len(text)
            if total >= limit_bytes:
                return texts
    return texts


def train_tokenizer(vocab: int, limit_bytes: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` of `vocab` tokens, EOS id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(training_text(limit_bytes),
                            trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                show_progress=False))
    return tok


def byte_decoder() -> dict:
    """GPT-2's byte-level alphabet: char -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def byte_spelling(tok, name: str) -> list:
    """The name as one byte token per byte (not the tokenizer's spelling)."""
    enc = {b: c for c, b in byte_decoder().items()}
    return [tok.token_to_id(enc[b]) for b in name.encode()]


def regex_escape(name: str) -> str:
    return "".join("\\" + c if c in "\\.^$|?*+()[]{}/-#&~" else c for c in name)


def name_regex(names) -> str:
    """The alternation of the escaped names, in descending order: a name
    before any name it is a prefix of. outlines-core's Index follows
    leftmost-first alternation: with "HANGUL SYLLABLE BBYEG" before
    "HANGUL SYLLABLE BBYEGS" it rejected the longer name's last token."""
    return "(" + "|".join(regex_escape(n) for n in sorted(names, reverse=True)) + ")"


# ---------------------------------------------------------------- engines


def _apply_bitmask(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """int32 (B, ceil(V/32)) bitmask -> logits with disallowed tokens at -inf."""
    V = logits.shape[1]
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :V]
    return np.where(bits.astype(bool), logits, -np.inf)


def _bit(bitmask: np.ndarray, row: int, token: int) -> bool:
    return bool((int(bitmask[row, token >> 5]) >> (token & 31)) & 1)


class Engine:
    """load() (imports MODULES, timed apart from the compile); compile(names);
    start(rows) -> state; step(state, logits, tokens, t) -> masked logits
    (matchers advanced); accepts(ids) -> bool."""

    MODULES: tuple = ()

    def __init__(self, tok, V: int, eos: int):
        self.tok, self.V, self.eos = tok, V, eos

    def load(self) -> None:
        import importlib
        for name in self.MODULES:
            importlib.import_module(name)

    def accepts_all(self, spellings: list) -> list:
        return [self.accepts(ids) for ids in spellings]

    def hf_tokenizer(self):
        from transformers import PreTrainedTokenizerFast
        return PreTrainedTokenizerFast(tokenizer_object=self.tok, eos_token=EOS)


class XGrammar(Engine):
    MODULES = ("xgrammar", "transformers")

    def compile(self, names):
        import xgrammar as xgr
        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(self.hf_tokenizer(), vocab_size=self.V,
                                                  stop_token_ids=[self.eos])
        compiler = xgr.GrammarCompiler(info, max_threads=2)
        self.grammar = compiler.compile_grammar(
            "root ::= " + " | ".join(json.dumps(n, ensure_ascii=False) for n in names))

    def start(self, rows):
        matchers = [self.xgr.GrammarMatcher(self.grammar) for _ in range(rows)]
        return matchers, self.xgr.allocate_token_bitmask(rows, self.V).numpy(), \
            self.xgr.BatchGrammarMatcher(max_threads=2)

    def step(self, state, logits, tokens, t):
        matchers, bitmask, batch = state
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask, 0)
        else:
            batch.batch_fill_next_token_bitmask(matchers, bitmask)
        out = _apply_bitmask(logits, bitmask)
        for m, tok in zip(matchers, tokens):
            m.accept_token(int(tok))
        return out

    def accepts(self, ids):
        m = self.xgr.GrammarMatcher(self.grammar)
        bitmask = self.xgr.allocate_token_bitmask(1, self.V).numpy()
        for tok in list(ids) + [self.eos]:
            m.fill_next_token_bitmask(bitmask, 0)
            if not _bit(bitmask, 0, tok):
                return False
            if tok != self.eos and not m.accept_token(tok):
                return False
        return True


class LLGuidance(Engine):
    MODULES = ("llguidance", "llguidance.hf", "llguidance.numpy", "transformers")

    def compile(self, names):
        import llguidance
        import llguidance.hf
        import llguidance.numpy
        self.ll, self.lln = llguidance, llguidance.numpy
        self.lltok = llguidance.hf.from_tokenizer(self.hf_tokenizer(), n_vocab=self.V,
                                                  eos_token=self.eos)
        self.grammar = llguidance.LLMatcher.grammar_from_regex(name_regex(names))
        self.matcher = llguidance.LLMatcher(self.lltok, self.grammar)
        if self.matcher.is_error():
            raise RuntimeError(self.matcher.get_error())
        self.executor = llguidance.LLExecutor()

    def start(self, rows):
        self.matcher.reset()
        matchers = [self.matcher.deep_copy() for _ in range(rows)]
        return matchers, self.lln.allocate_token_bitmask(rows, self.V)

    def step(self, state, logits, tokens, t):
        matchers, bitmask = state
        if len(matchers) == 1:
            self.lln.fill_next_token_bitmask(matchers[0], bitmask, 0)
        else:
            self.lln.fill_next_token_bitmask_par(self.executor,
                                                 [(m, i) for i, m in enumerate(matchers)], bitmask)
        out = _apply_bitmask(logits, bitmask)
        for m, tok in zip(matchers, tokens):
            m.consume_token(int(tok))
        return out

    def accepts(self, ids):
        self.matcher.reset()
        m = self.matcher.deep_copy()
        bitmask = self.lln.allocate_token_bitmask(1, self.V)
        for tok in list(ids) + [self.eos]:
            self.lln.fill_next_token_bitmask(m, bitmask, 0)
            if not _bit(bitmask, 0, tok) or m.is_error():
                return False
            if tok != self.eos and not m.consume_token(tok):
                return False
        return True


class OutlinesCore(Engine):
    MODULES = ("outlines_core",)

    def compile(self, names):
        from outlines_core import Guide, Index, Vocabulary
        self.Guide = Guide
        dec = byte_decoder()
        table = {}
        for token, i in self.tok.get_vocab().items():
            if i != self.eos:
                table.setdefault(bytes(dec[c] for c in token), []).append(i)
        self.index = Index(name_regex(names), Vocabulary(self.eos, table))

    def start(self, rows):
        W = (self.V + 31) // 32
        return [self.Guide(self.index) for _ in range(rows)], np.zeros((rows, W), np.int32)

    def step(self, state, logits, tokens, t):
        guides, bitmask = state
        W = bitmask.shape[1]
        for i, g in enumerate(guides):
            g.write_mask_into(bitmask[i].ctypes.data, W, 4)
        out = _apply_bitmask(logits, bitmask)
        for g, tok in zip(guides, tokens):
            g.advance(int(tok), return_tokens=False)
        return out

    def accepts(self, ids):
        g = self.Guide(self.index)
        for tok in list(ids) + [self.eos]:
            if tok not in set(g.get_tokens()):
                return False
            if tok != self.eos:
                g.advance(tok, return_tokens=False)
        return True


class DictTrie(Engine):
    MODULES = ("torch", "transformers.generation.logits_process")

    def compile(self, names):
        import torch
        from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor
        self.torch, self.Processor = torch, PrefixConstrainedLogitsProcessor
        self.trie = {}
        for ids in (e.ids for e in self.tok.encode_batch(names)):
            node = self.trie
            for t in ids:
                node = node.setdefault(t, {})
            node.setdefault(self.eos, {})

    def _fn(self, batch_id, input_ids):
        node = self.trie
        for tok in input_ids[PROMPT_LENGTH:].tolist():
            node = node.get(tok, {})
        return list(node)

    def start(self, rows):
        self.torch.set_num_threads(1)
        return [self.Processor(self._fn, num_beams=rows), np.zeros((rows, PROMPT_LENGTH), np.int64)]

    def step(self, state, logits, tokens, t):
        processor, input_ids = state
        out = processor(self.torch.from_numpy(input_ids), self.torch.from_numpy(logits))
        state[1] = np.concatenate([input_ids, np.asarray(tokens, np.int64)[:, None]], axis=1)
        return out

    def accepts(self, ids):
        node = self.trie
        for tok in list(ids) + [self.eos]:
            if tok not in node:
                return False
            node = node[tok]
        return True


class Static(Engine):
    MODULES = ("jax", "static_compiler", "static_compiler.backend.decode")

    def load(self) -> None:
        super().load()
        import jax
        jax.devices()  # the XLA client starts once per process (~0.08 s), not per catalogue

    SPELLINGS = "canonical"

    def compile(self, names):
        import jax

        import static_compiler as sc
        from static_compiler.backend import decode
        self.jax, self.sc, self.decode = jax, sc, decode
        self.compiled = sc.compile_constraints(names, vocab_size=self.V, tokenizer=self.tok,
                                               spellings=self.SPELLINGS)
        jax.block_until_ready(self.compiled.lowered.device_tables)
        self._steps = {}
        plan = self.compiled.plan

        def traced(tables, logits, state, tokens, t):
            return (decode.mask(plan, tables, logits, state, t),
                    decode.advance(plan, tables, state, tokens, t))
        self._traced = jax.jit(traced)  # one program for every step (the checks)

    def _step_fn(self, t):
        """The earlier path (`--old-path`): mask + advance jitted as one
        program per step, every step's tables passed as arguments, the mask
        built as (B, V) allowed flags (traced with the scatter off)."""
        if t not in self._steps:
            plan, decode = self.compiled.plan, self.decode
            from static_compiler.backend.decode import processor

            def fn(tables, logits, state, tokens):
                scatter, processor.SCATTER_MAX_COLUMNS = processor.SCATTER_MAX_COLUMNS, 2 ** 62
                try:
                    return (decode.mask(plan, tables, logits, state, t),
                            decode.advance(plan, tables, state, tokens, t))
                finally:
                    processor.SCATTER_MAX_COLUMNS = scatter
            self._steps[t] = self.jax.jit(fn)
        return self._steps[t]

    def start(self, rows):
        return [self.compiled.processor(rows), self.compiled.init_processor(rows)]

    def device_logits(self, logits):
        return self.jax.device_put(logits)

    def step(self, state, logits, tokens, t):
        """`compiled.processor(rows)`: mask, then advance, one dispatch each."""
        proc = state[0]
        tokens = self._device_tokens(tokens)
        masked = proc.mask(logits, state[1], t)
        state[1] = proc.advance(state[1], tokens, t)
        return self.jax.block_until_ready(masked)

    def _device_tokens(self, tokens):
        # the walk's tokens as device arrays, made once (a model's sampled
        # tokens are device arrays already)
        cache = self.__dict__.setdefault("_tokens", {})
        key = (id(tokens), tokens.shape)
        if key not in cache:
            cache[key] = (tokens, self.jax.device_put(tokens))
        return cache[key][1]

    def old_step(self, state, logits, tokens, t):
        masked, state[1] = self._step_fn(t)(self.compiled.lowered.device_tables, logits, state[1],
                                            self._device_tokens(tokens))
        return self.jax.block_until_ready(masked)

    def accepts_all(self, spellings):
        import jax.numpy as jnp
        T = self.compiled.max_length
        rows = len(spellings)
        lengths = np.array([len(s) for s in spellings])
        toks = np.full((rows, T + 1), self.eos, np.int32)
        for i, s in enumerate(spellings):
            toks[i, :min(len(s), T)] = s[:T]
        ok = lengths < T  # the end token must fit too
        state = self.compiled.init_processor(rows)
        zeros = jnp.zeros((rows, self.V), jnp.float32)
        for t in range(T):
            masked, state = self._traced(self.compiled.lowered.device_tables, zeros, state,
                                         jnp.asarray(toks[:, t]), jnp.int32(t))
            allowed = np.asarray(masked) > self.sc.SENTINEL_SCORE
            ok &= allowed[np.arange(rows), toks[:, t]]
        return ok.tolist()

    def beam_step_ms(self, beams: int, repeats: int) -> float:
        import jax.numpy as jnp
        table = jnp.asarray(np.random.default_rng(3).standard_normal((256, self.V), np.float32))

        def logits_fn(last_tokens, step, carry):
            return table[last_tokens % 256], carry
        run = lambda: self.jax.block_until_ready(
            self.sc.beam_search(self.compiled, logits_fn, batch_size=1, beam_size=beams).tokens)
        run()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return 1e3 * float(np.median(times)) / self.compiled.max_length


class StaticAnySpelling(Static):
    SPELLINGS = "any"


ENGINE_CLASSES = {"static": Static, "static-any": StaticAnySpelling, "xgrammar": XGrammar,
                  "llguidance": LLGuidance,
                  "outlines-core": OutlinesCore, "hf-dict-trie": DictTrie}


def availability(engine: str):
    """(installed, version or None)."""
    module, dist = ENGINE_PACKAGES[engine]
    if importlib.util.find_spec(module) is None:
        return False, None
    from importlib import metadata
    try:
        return True, metadata.version(dist)
    except metadata.PackageNotFoundError:
        return True, None


# ---------------------------------------------------------------- the child


def _proc_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _walk_ms(engine, logits, walk, T, repeats, steps=None) -> list:
    """Per stepper (default: `engine.step`), the median over repeats of the
    mean step (ms) of walking `walk` (rows, T); several steppers are timed
    interleaved (walk by walk), so load hits them alike."""
    steps = [engine.step] if steps is None else steps
    rows = walk.shape[0]
    columns = [walk[:, t].copy() for t in range(T)]
    times = [[] for _ in steps]
    for r in range(repeats + 1):  # the first walk warms up
        for i, step in enumerate(steps):
            state = engine.start(rows)
            total = 0.0
            for t in range(T):
                tokens = columns[t]
                start = time.perf_counter()
                step(state, logits, tokens, t)
                total += time.perf_counter() - start
            if r:
                times[i].append(total / T)
    return [1e3 * float(np.median(x)) for x in times]


def child(args) -> dict:
    import gc

    from tokenizers import Tokenizer
    with open(os.path.join(args.workdir, f"work_{args.n}.json")) as f:
        work = json.load(f)
    tok = Tokenizer.from_file(os.path.join(args.workdir, "tokenizer.json"))
    V, eos = tok.get_vocab_size(), tok.token_to_id(EOS)
    engine = ENGINE_CLASSES[args.child](tok, V, eos)
    spell = lambda xs: [e.ids for e in tok.encode_batch(xs)]
    accept_ids, reject_ids = spell(work["accept"]), spell(work["reject"])
    noncanon = [byte_spelling(tok, n) for n in work["accept"][:NON_CANONICAL]]
    noncanon = [(ids, canon) for ids, canon in zip(noncanon, accept_ids) if ids != canon]
    walk_ids = spell(work["walk"])
    T = min(args.walk_steps, min(len(w) for w in walk_ids))
    walk = np.array([w[:T] for w in walk_ids], np.int32)
    names = work["names"]
    del work
    start = time.perf_counter()
    engine.load()
    import_s = time.perf_counter() - start
    gc.collect()
    rss0 = _proc_kb("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    engine.compile(names)
    compile_s = time.perf_counter() - start
    rss_mb = (_proc_kb("VmHWM") - rss0) / 1024
    del names
    verdicts = engine.accepts_all(accept_ids + reject_ids + [ids for ids, _ in noncanon])
    accepted = verdicts[:len(accept_ids)]
    rejected = [not a for a in verdicts[len(accept_ids):len(accept_ids) + len(reject_ids)]]
    nc = verdicts[len(accept_ids) + len(reject_ids):]
    out = {"compile_s": compile_s, "import_s": import_s, "rss_mb": rss_mb,
           "accepted": int(sum(accepted)), "accept_total": len(accepted),
           "rejected": int(sum(rejected)), "reject_total": len(rejected),
           "noncanonical_accepted": int(sum(nc)), "noncanonical_total": len(nc),
           "walk_steps": T}
    rng = np.random.default_rng(4)
    for rows in (1, args.rows):
        logits = rng.standard_normal((rows, V)).astype(np.float32)
        if isinstance(engine, Static):
            logits = engine.device_logits(logits)
        gc.collect()
        gc.disable()
        try:
            if isinstance(engine, Static) and args.old_path:
                out[f"mask_ms_{rows}"], out[f"old_mask_ms_{rows}"] = _walk_ms(
                    engine, logits, walk[:rows], T, args.repeats, [engine.step, engine.old_step])
            else:
                out[f"mask_ms_{rows}"], = _walk_ms(engine, logits, walk[:rows], T, args.repeats)
        except Exception as e:  # a peer that rejects a name's own tokens
            out[f"mask_ms_{rows}"] = None
            out["walk_error"] = f"{type(e).__name__}: {e}"[:200]
        finally:
            gc.enable()
    if isinstance(engine, Static) and not args.no_beam:
        out["beam_step_ms"] = engine.beam_step_ms(args.rows, args.repeats)
        out["max_length"] = engine.compiled.max_length
    return out


# ---------------------------------------------------------------- the parent


def prepare(workdir: str, sizes, vocab: int, text_bytes: int, rows: int, seed: int,
            checks: int = CHECKS) -> dict:
    """Trains the tokenizer and writes each N's names and checks; returns
    facts about the work for the report."""
    start = time.perf_counter()
    tok = train_tokenizer(vocab, text_bytes)
    tok.save(os.path.join(workdir, "tokenizer.json"))
    train_s = time.perf_counter() - start
    real = len(real_names(seed))
    rng = np.random.default_rng(seed + 5)
    for n in sizes:
        names = catalogue(n, seed)
        assert len(set(names)) == n
        accept = [names[i] for i in rng.choice(n, size=min(checks, n), replace=False)]
        reject = near_misses(names, checks, seed)
        lengths = np.array([len(e.ids) for e in tok.encode_batch(names)])
        # the walk: names at least as long (in tokens) as the median
        long_ones = np.flatnonzero(lengths >= max(2, int(np.median(lengths))))
        walk = [names[i] for i in rng.choice(long_ones, size=rows, replace=len(long_ones) < rows)]
        with open(os.path.join(workdir, f"work_{n}.json"), "w") as f:
            json.dump({"names": names, "accept": accept, "reject": reject, "walk": walk}, f)
    return {"vocab": tok.get_vocab_size(), "train_s": train_s, "real_names": real}


def run_child(engine: str, n: int, args) -> dict:
    cmd = [sys.executable, "-m", "tools.bench.peers", "--child", engine, "--workdir",
           args.workdir, "--n", str(n), "--rows", str(args.rows), "--repeats", str(args.repeats),
           "--walk-steps", str(args.walk_steps)]
    cmd += ["--old-path"] if args.old_path else []
    cmd += ["--no-beam"] if args.no_beam else []
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout (> {args.timeout:.0f} s)"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"status": f"failed (exit {proc.returncode}: {err[:120]})"}
    return {"status": "ok", **json.loads(lines[-1])}


def _n(n: int) -> str:
    """1000 -> 1e3; other counts as they are."""
    e = len(str(n)) - 1
    return f"1e{e}" if n == 10 ** e and e >= 3 else str(n)


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def table(results: list, rows: int) -> str:
    head = (f"| engine | version | N | import s | compile s | RSS MB | mask ms @1 | mask ms @{rows} | "
            f"our beam step ms @{rows} | exact | non-canonical accepted |")
    old = any("old_mask_ms_1" in r for r in results)
    if old:
        head = head.replace(f"mask ms @{rows} |",
                            f"mask ms @{rows} | old path ms @1 | old path ms @{rows} |")
    lines = [head, "|---|---|--:|--:|--:|--:|--:|--:|" + ("--:|--:|" if old else "") + "--:|---|---|"]
    for r in results:
        if r["status"] != "ok":
            lines.append(f"| {r['engine']} | {r['version'] or '-'} | {_n(r['n']) if r['n'] else '-'} | "
                         f"{r['status']} | | | | | | | |")
            continue
        exact = (r["accepted"] == r["accept_total"] and r["rejected"] == r["reject_total"])
        exact_s = "yes" if exact else (f"no ({r['accepted']}/{r['accept_total']} accepted, "
                                       f"{r['rejected']}/{r['reject_total']} rejected)")
        nc = "yes" if r["noncanonical_accepted"] else "no"
        if r["noncanonical_accepted"] not in (0, r["noncanonical_total"]):
            nc = f"{r['noncanonical_accepted']}/{r['noncanonical_total']}"
        lines.append(f"| {r['engine']} | {r['version'] or '-'} | {_n(r['n'])} | "
                     f"{_f(r.get('import_s'), '.2f')} | {r['compile_s']:.2f} | {r['rss_mb']:.0f} | {_f(r['mask_ms_1'], '.3f')} | "
                     f"{_f(r[f'mask_ms_{rows}'], '.3f')} | " +
                     (f"{_f(r.get('old_mask_ms_1'), '.3f')} | "
                      f"{_f(r.get(f'old_mask_ms_{rows}'), '.3f')} | " if old else "") +
                     f"{_f(r.get('beam_step_ms'), '.3f')} | "
                     f"{exact_s} | {nc} |")
    return "\n".join(lines)


def _count(text: str) -> int:
    value = float(text)
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer (1e6 is fine)")
    return int(value)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m tools.bench peers",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N = 1e3, 1e4; V = 8192; 5 repeats")
    p.add_argument("--items", nargs="+", type=_count, help="catalogue sizes N")
    p.add_argument("--vocab", type=_count, help="BPE vocabulary size (16384; quick 8192)")
    p.add_argument("--text-mb", type=float, help="MB of stdlib source to train on (8; quick 2)")
    p.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    p.add_argument("--rows", type=_count, default=70, help="sequences per step (a beam's width)")
    p.add_argument("--repeats", type=_count, help="timed walks (10; quick 5)")
    p.add_argument("--walk-steps", type=_count, default=MAX_WALK_STEPS,
                   help=f"timed steps per walk ({MAX_WALK_STEPS}; fewer for a smoke run: each "
                        "step is a program of ours to compile)")
    p.add_argument("--checks", type=_count, default=CHECKS,
                   help="names that must be accepted, and near misses that must be rejected")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per engine and N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the markdown here")
    p.add_argument("--old-path", action="store_true",
                   help="also time our earlier per-step path (the jitted pair with every "
                        "step's tables as arguments, dense mask), interleaved with the "
                        "processor's, as extra 'old' columns")
    p.add_argument("--no-beam", action="store_true", help="skip our beam step timing")
    p.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.items is None:
        args.items = [10 ** 3, 10 ** 4] if args.quick else [10 ** 3, 10 ** 4, 10 ** 5, 10 ** 6]
    if args.vocab is None:
        args.vocab = 8192 if args.quick else 16384
    if args.text_mb is None:
        args.text_mb = min(2.0 if args.quick else 8.0, max(0.3, args.vocab / 2000))
    if args.repeats is None:
        args.repeats = 5 if args.quick else 10
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.child:
        print(json.dumps(child(args)))
        return 0
    start = time.perf_counter()
    results, notes = [], []
    available = {e: availability(e) for e in args.engines}
    for e, (ok, _) in available.items():
        if not ok:
            module = ENGINE_PACKAGES[e][0]
            notes.append(f"{e}: skipped (not installed: `pip install {module}`, or the `peers` "
                         "extra)")
            print(f"[peers] {notes[-1]}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="peers-") as workdir:
        args.workdir = workdir
        facts = prepare(workdir, args.items, args.vocab, int(args.text_mb * 2 ** 20), args.rows,
                        args.seed, args.checks)
        print(f"[peers] tokenizer: V = {facts['vocab']} in {facts['train_s']:.1f} s",
              file=sys.stderr)
        for n in args.items:
            for e in args.engines:
                ok, version = available[e]
                if not ok:
                    continue
                if n > MAX_ITEMS.get(e, n):
                    results.append({"engine": e, "version": version, "n": n,
                                    "status": f"skipped (N > {_n(MAX_ITEMS[e])})"})
                    continue
                t0 = time.perf_counter()
                r = {"engine": e, "version": version, "n": n, **run_child(e, n, args)}
                print(f"[peers] {e} N={n}: {r['status']} ({time.perf_counter() - t0:.1f} s)",
                      file=sys.stderr)
                results.append(r)
    for e, (ok, _) in available.items():
        if not ok:
            results.append({"engine": e, "version": None, "n": None,
                            "status": "skipped (not installed)"})
    from tools.bench.output import machine_line
    lines = [f"# Peers: one of N names; V = {facts['vocab']} (byte-level BPE trained on "
             f"{args.text_mb:g} MB of the stdlib's source), {args.rows} sequences per step, "
             f"{args.repeats} repeats",
             f"# {machine_line()}",
             "# command: python -m tools.bench peers " + " ".join(
                 sys.argv[1:] if argv is None else argv),
             "", table(results, args.rows), ""]
    for r in results:
        if r.get("walk_error"):
            notes.append(f"{r['engine']} N={_n(r['n'])}: the timed walk along real names failed: "
                         f"{r['walk_error']}")
    lines += [f"- {note}" for note in notes]
    lines.append(f"\n# {time.perf_counter() - start:.1f} s")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())
