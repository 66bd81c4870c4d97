"""A synthetic experience store for the dashboard's tests and bench: records, reports and a release
chain written through the same code the gateway uses (`ExperienceStore`, `ArtifactStore`,
`ReleaseChain`), without serving anything.

    from dashboard.synthetic import write_store
    write_store("/tmp/data", records=100_000)        # demo-add: 4 releases, sessions, rewards

Traffic spans the last `hours` hours; each release serves one slice of it, later releases score
better, about 70 % of the records have a report, a few are exact repeats.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from reef.config import StoreConfig
from reef.core.hashing import sha256_json
from reef.experience.schema import Choice, Message, Record, Report, Tag, record_content_hash
from reef.experience.store import ExperienceStore
from reef.registry import ArtifactStore, Lineage, Release, ReleaseChain
from reef.registry.candidates import CandidateRegistry, GateResult, PromptOutcome

SYSTEM = "You add numbers. Reply as 'Answer: <number>'."
TEMPLATES = ("What is {a} + {b}?", "Compute {a} + {b}.", "Add {a} and {b}.")
BATCH = 5_000


@dataclass(frozen=True)
class SyntheticStore:
    data_dir: Path
    scenario: str
    releases: list[Release]
    records: int
    reports: int


def _harness(root: Path, name: str, prompt: str, rules: str = "Reply with the answer only.") -> Path:
    """A harness tree as reef.registry.harness lays it out: system prompt, rules, one skill."""
    tree = root / name
    (tree / "skills" / "add").mkdir(parents=True)
    (tree / "system.md").write_text(prompt + "\n")
    (tree / "rules.md").write_text(rules + "\n")
    (tree / "skills" / "add" / "SKILL.md").write_text(
        "---\nname: add\ndescription: add two numbers\n---\nAdd the ones, then the tens.\n")
    return tree


def make_harness_candidate(out: Path, scenario: str, files: dict[str, str], *, parent_release: str,
                           parent_harness: str | None, mutations: list[dict[str, Any]] | None = None,
                           recipe: str = "recipes.harness_evolve.recipe:HarnessEvolve") -> Path:
    """A harness candidate folder as a harness recipe writes it (reef.recipe.harness_recipe): the whole tree
    after its mutations at the folder's root, and candidate.json with kind "harness", the mutations
    and a lineage naming the harness they were applied to (`parent_harness`)."""
    for rel, text in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    (out / "candidate.json").write_text(json.dumps({
        "kind": "harness", "id": f"{scenario}-{out.name}", "scenario": scenario,
        "created_at": datetime.now(UTC).isoformat(), "path": str(out),
        "metrics": {"failures": 12, "records": 64, "mutations": len(mutations or []), "proposer": "mined"},
        "mutations": mutations or [],
        "lineage": {"snapshot_id": f"{scenario}-snap-{out.name}", "recipe": recipe, "params": {"max_mutations": 2},
                    "parent_release": parent_release, "parent_harness": parent_harness,
                    "code_commit": "0123abc", "base_model": "data/models/tiny"},
        "training_log": []}))
    return out


def _fake_base(root: Path) -> Path:
    """Stands in for the base model's folder: the synthetic chain needs weights to point at, never serves them."""
    folder = root / "base"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"synthetic weights, never loaded")
    (folder / "config.json").write_text('{"model_type": "synthetic"}')
    return folder


def write_chain(data_dir: Path, scenario: str, n_releases: int = 4) -> list[Release]:
    """r0 (create: base weights), then `n_releases - 1` harness releases on the same weights, each
    with a harness recipe's lineage."""
    artifacts = ArtifactStore.for_data_dir(data_dir, fsync=False)
    chain = ReleaseChain.for_data_dir(data_dir, scenario, artifacts=artifacts, fsync=False)
    with tempfile.TemporaryDirectory() as tmp:
        base = artifacts.import_base(_fake_base(Path(tmp)), lineage=Lineage(base_model="data/models/tiny"))
        releases = [chain.ensure_base(base.content_id, base.lineage)]
        for i in range(1, n_releases):
            prompt = f"{SYSTEM} Think step {i}: add the ones, then the tens."
            lineage = Lineage(
                snapshot_id=f"{scenario}-snap-{i:04d}", snapshot_hash=hashlib.sha256(f"snap{i}".encode()).hexdigest(),
                recipe="recipes.harness_evolve.recipe:HarnessEvolve", params={"max_mutations": i},
                parent_release=releases[-1].release_id, code_commit="0123abc", base_model="data/models/tiny",
                parent_harness=releases[-1].harness_id,
            )
            tree = artifacts.import_harness(_harness(Path(tmp), f"v{i}", prompt), lineage=lineage)
            evaluation = {"decision": "select", "candidate_success": 0.3 + 0.15 * i, "head_success": 0.15 + 0.15 * i,
                          "ci_low": 0.05, "ci_high": 0.25, "delta": 0.15, "head_release_id": releases[-1].release_id}
            releases.append(chain.publish(releases[-1].release_id, base.content_id, "full", "train",
                                          evaluation=evaluation, approved_by="synthetic", lineage=base.lineage,
                                          harness_id=tree.content_id, harness_lineage=lineage))
    return releases


def _record(rng: random.Random, scenario: str, release_id: str, session: str, created: datetime,
            history: list[Message], success_p: float, index: int) -> tuple[Record, bool]:
    a, b = rng.randrange(10), rng.randrange(10)
    user = Message(role="user", content=rng.choice(TEMPLATES).format(a=a, b=b))
    messages = [*history, user]
    correct = rng.random() < success_p
    answer = a + b if correct else (a + b + rng.choice((-2, -1, 1, 3))) % 19
    n_tokens = rng.randrange(4, 12)
    choice = Choice(index=0, content=f"Answer: {answer}", finish_reason="stop",
                    token_ids=[rng.randrange(32, 500) for _ in range(n_tokens)],
                    logprobs=[-abs(rng.gauss(0.0, 0.6)) for _ in range(n_tokens)])
    request = {"model": "reef-tiny", "messages": [m.model_dump(exclude_none=True) for m in messages]}
    body_hash = sha256_json(request)
    record = Record(
        record_id=f"rec-{index:09d}", scenario=scenario, session_id=session, created_at=created,
        request_model="reef-tiny", response_model="reef-tiny", response_id=f"chatcmpl-{index}",
        release_id=release_id, messages=messages, temperature=0.7, max_tokens=16, choices=[choice],
        finish_reasons=["stop"], prompt_token_ids=[rng.randrange(32, 500) for _ in range(12 + 6 * len(history))],
        input_tokens=12 + 6 * len(history), output_tokens=n_tokens, latency_ms=rng.uniform(20, 200),
        ttft_ms=rng.uniform(5, 30), tags=[Tag(name="task_id", value=f"add-{a}-{b}")],
        content_hash=record_content_hash(scenario, messages, [choice]), body_hash=body_hash,
        request_json="{}", response_json="{}",
    )
    return record, correct


def write_records(data_dir: Path, scenario: str, release_ids: list[str], n: int, *, hours: float = 24.0,
                  seed: int = 0, report_fraction: float = 0.7, now: datetime | None = None) -> tuple[int, int]:
    """`n` records in sessions of 1-3 turns over the last `hours`; returns (records, reports)."""
    rng = random.Random(seed)
    now = now or datetime.now(UTC)
    start = now - timedelta(hours=hours)
    step = timedelta(hours=hours) / max(n, 1)
    reports = 0
    config = StoreConfig(fsync=False, flush_interval_s=3600, flush_max_records=10**9)
    with ExperienceStore(data_dir, config) as store:
        batch: list[Record] = []
        report_batch: list[Report] = []
        i = 0
        while i < n:
            session = f"sess-{i:09d}"
            history: list[Message] = [Message(role="system", content=SYSTEM)]
            for _turn in range(min(rng.choice((1, 1, 2, 3)), n - i)):
                created = start + step * i
                # Each release serves its slice of the time span; later releases score better.
                r = min(int(len(release_ids) * i / n), len(release_ids) - 1)
                success_p = 0.2 + 0.6 * r / max(len(release_ids) - 1, 1) + 0.05 * math.sin(i / 5000)
                record, correct = _record(rng, scenario, release_ids[r], session, created, history, success_p, i)
                batch.append(record)
                history = [*record.messages, Message(role="assistant", content=record.choices[0].content)]
                if rng.random() < report_fraction:
                    score = 1.0 if correct else 0.0
                    content = {"record_ids": [record.record_id], "score": score}
                    report_batch.append(Report(
                        report_id=f"rep-{i:09d}", scenario=scenario, record_ids=[record.record_id], score=score,
                        feedback="correct" if correct else "wrong", created_at=created + timedelta(seconds=1),
                        content_hash=sha256_json(content)))
                i += 1
            if len(batch) >= BATCH:
                store.append_records_sync(batch)
                store.append_reports_sync(report_batch)
                reports += len(report_batch)
                batch, report_batch = [], []
                store.flush()
        if batch:
            store.append_records_sync(batch)
        if report_batch:
            store.append_reports_sync(report_batch)
            reports += len(report_batch)
    return n, reports


def gate_result(head_release_id: str, *, success: float, head_success: float, seed: int = 0,
                prompts: int = 40, samples: int = 4) -> GateResult:
    """A gate decision with per-prompt outputs on demo-add-style prompts, as the gate records it."""
    rng = random.Random(seed)
    outcomes = []
    for i in range(prompts):
        a, b = i % 10, (i * 7) % 10
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} + {b}?"}]

        def replies(p: float, a: int = a, b: int = b) -> list[str]:
            return [f"Answer: {a + b if rng.random() < p else a + b + 1}" for _ in range(samples)]

        cand, head = replies(success), replies(head_success)
        outcomes.append(PromptOutcome(
            messages=messages, candidate_replies=cand, head_replies=head,
            candidate_score=sum(r == f"Answer: {a + b}" for r in cand) / samples,
            head_score=sum(r == f"Answer: {a + b}" for r in head) / samples))
    diffs = [o.candidate_score - o.head_score for o in outcomes]
    delta = sum(diffs) / len(diffs)
    spread = 1.96 * statistics.pstdev(diffs) / math.sqrt(len(diffs))
    selected = delta - spread > 0
    return GateResult(
        decision="select" if selected else "reject",
        reason=f"synthetic: delta {delta:+.3f}, 95% CI [{delta - spread:+.3f}, {delta + spread:+.3f}]",
        head_release_id=head_release_id,
        candidate_success=sum(o.candidate_score for o in outcomes) / len(outcomes),
        head_success=sum(o.head_score for o in outcomes) / len(outcomes), delta=delta, ci_low=delta - spread,
        ci_high=delta + spread, confidence=0.95, prompts=len(outcomes), samples_per_prompt=samples,
        wins=sum(d > 0 for d in diffs), losses=sum(d < 0 for d in diffs), ties=sum(d == 0 for d in diffs),
        seconds=1.0, per_prompt=outcomes)


def write_harness_candidates(data_dir: Path, scenario: str, head: Release, n: int = 3) -> list[str]:
    """`n` harness candidates mutating `head`'s harness, registered and gated (the last one selected)."""
    registry = CandidateRegistry(data_dir, scenario, fsync=False)
    ids = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            prompt = f"{SYSTEM} Variant {i}: check the sum twice."
            rule = f"Check the sum twice (variant {i})."
            files = {"system.md": prompt + "\n", "rules.md": f"Reply with the answer only.\n{rule}\n"}
            mutations = [{"op": "update", "path": "system.md", "reason": "replies skipped the check",
                          "content": files["system.md"]},
                         {"op": "update", "path": "rules.md", "reason": f"feedback: 'wrong sum' x{3 + i}",
                          "content": files["rules.md"]}]
            folder = make_harness_candidate(Path(tmp) / f"cand{i}", scenario, files, parent_release=head.release_id,
                                            parent_harness=head.harness_id, mutations=mutations)
            view = registry.register(folder)
            good = i == n - 1
            registry.record_gate(view.candidate_id, gate_result(
                head.release_id, success=0.8 if good else 0.5, head_success=0.55, seed=i))
            ids.append(view.candidate_id)
    return ids


def write_store(data_dir: Path | str, *, scenario: str = "demo-add", records: int = 2_000, releases: int = 4,
                hours: float = 24.0, seed: int = 0, candidates: int = 3) -> SyntheticStore:
    """Everything the dashboard shows, for one scenario: a harness release chain, records served by
    it with reports, and gated harness candidates."""
    data_dir = Path(data_dir)
    chain = write_chain(data_dir, scenario, releases)
    n, reports = write_records(data_dir, scenario, [r.release_id for r in chain], records, hours=hours, seed=seed)
    if candidates:
        write_harness_candidates(data_dir, scenario, chain[-1], candidates)
    return SyntheticStore(data_dir, scenario, chain, n, reports)


def make_lora_candidate(base_model: Path, out: Path, scenario: str = "demo-add", seed: int = 0,
                        rank: int = 4) -> Path:
    """A real (untrained, randomly initialised) LoRA adapter on `base_model`, with a candidate.json
    as a recipe writes it: vLLM loads and serves it, so a release of it swaps for real."""
    import torch
    from peft import LoraConfig, get_peft_model

    from reef.core.hashing import sha256_file
    from reef.sampling.load import load_model

    torch.manual_seed(seed)
    model, _ = load_model(base_model)
    peft = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    peft.save_pretrained(out)
    weights = next(base_model.glob("*.safetensors"))
    lineage = {"snapshot_id": f"{scenario}-synthetic-{seed}",
               "snapshot_hash": hashlib.sha256(str(seed).encode()).hexdigest(),
               "recipe": "dashboard.synthetic:make_lora_candidate", "params": {"r": rank, "seed": seed},
               "parent_release": f"{scenario}@r0", "code_commit": "unknown", "base_model": str(base_model),
               "base_model_sha256": sha256_file(weights), "versions": {}}
    rng = random.Random(seed)  # per-step curves shaped like a real round's: loss down, reward up
    log = [{"step": t, "loss": round(1.0 / t + rng.uniform(0, 0.1), 4), "reward": round(min(1.0, 0.2 + 0.03 * t), 4),
            "grad_norm": round(rng.uniform(0.2, 1.0), 4), "learning_rate": 5e-4} for t in range(1, 21)]
    (out / "candidate.json").write_text(json.dumps({
        "id": f"{scenario}-lora-{seed}", "kind": "lora", "scenario": scenario, "metrics": {"train_loss": 1.0},
        "lineage": lineage, "created_at": datetime.now(UTC).isoformat(), "training_log": log}))
    return out
