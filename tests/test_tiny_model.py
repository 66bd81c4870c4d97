"""The embedded tiny model and the demo task: determinism, ChatML, loading, verifier, split, and
that the default model is weak on the demo task yet learnable from its own samples."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from reef.scenario import EvalSuite, Scenario, eval_suite, get_scenario, packaged_scenarios, reward_for, training_tasks
from tests.helpers.tiny import add_corpus as demo_corpus
from tests.helpers.tiny import model as tiny
from tests.helpers.tiny import task as demo
from tests.helpers.tiny.corpus import build_corpus, contributions

pytestmark = pytest.mark.start_early(11)

REPO = Path(__file__).resolve().parents[1]
QUICK_STEPS = 6  # both corpus stages get steps (2 learn, 4 calibrate); the weights are meaningless


@pytest.fixture(scope="module")
def quick_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The build's own evaluation, on every packaged scenario, with one sample per prompt instead of 16:
    # the metadata's eval keys are what is checked here (the calibrated figures are the real model's).
    evaluate = tiny.evaluate_model
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiny, "evaluate_model", lambda model_dir, seed=0: evaluate(model_dir, seed, samples=1))
        return tiny.build_tiny(tmp_path_factory.mktemp("tiny") / "a", seed=1, progress=False, steps=QUICK_STEPS)


# --- build ---------------------------------------------------------------------------------------


@pytest.mark.model_free
def test_packed_batches_give_the_padded_batch_loss_and_gradients() -> None:
    # The build packs a batch's documents into rows; transformers must keep attention within each
    # document (it reads restarting position_ids as packed sequences). If that ever stops, tokens
    # would attend across documents and the loss would silently differ from the padded batch's.
    rng = random.Random(0)
    docs = []
    for _ in range(tiny.BATCH_SIZE):
        ids = [rng.randrange(3, 200) for _ in range(rng.randrange(2, 90))]
        docs.append((ids, [-100 if rng.random() < 0.3 else i for i in ids]))
    torch.manual_seed(0)
    model = tiny.Qwen2ForCausalLM(tiny.Qwen2Config(vocab_size=256, pad_token_id=0, **tiny.MODEL_CONFIG))
    width = max(len(ids) for ids, _ in docs)
    ids = torch.zeros((len(docs), width), dtype=torch.long)
    mask, labels = torch.zeros_like(ids), torch.full_like(ids, -100)
    for row, (i, lab) in enumerate(docs):
        ids[row, : len(i)], labels[row, : len(lab)], mask[row, : len(i)] = torch.tensor(i), torch.tensor(lab), 1
    padded = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    padded.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    packed_ids, positions, packed_labels = tiny._pack(docs, tiny.MAX_DOC_TOKENS, pad_id=0)
    assert packed_ids.numel() < 0.8 * ids.numel()  # the point of packing
    packed = model(input_ids=packed_ids, position_ids=positions, labels=packed_labels, use_cache=False).loss
    packed.backward()
    assert torch.allclose(packed, padded, atol=1e-5), (packed.item(), padded.item())
    assert all(torch.allclose(p.grad, g, atol=1e-5) for p, g in zip(model.parameters(), grads, strict=True))


@pytest.mark.model_free
def test_same_seed_gives_identical_weights(quick_model: Path, tmp_path: Path) -> None:
    again = tiny.build_tiny(tmp_path / "b", seed=1, progress=False, steps=QUICK_STEPS, evaluate=False)
    assert tiny.weights_sha256(again) == tiny.weights_sha256(quick_model)
    assert (again / "tokenizer.json").read_bytes() == (quick_model / "tokenizer.json").read_bytes()
    # Another seed, built through the command-line entry point (`python -m tests.helpers.tiny.model`).
    other = tmp_path / "c"
    assert tiny.main_build_tiny(["--out", str(other), "--seed", "2", "--steps", str(QUICK_STEPS), "--no-eval",
                                 "--quiet"]) == 0
    assert json.loads((other / tiny.METADATA_FILE).read_text())["seed"] == 2
    assert tiny.weights_sha256(other) != tiny.weights_sha256(quick_model)


@pytest.mark.model_free
def test_corpus_is_deterministic() -> None:
    assert build_corpus(0).sha256() == build_corpus(0).sha256()
    assert build_corpus(0).sha256() != build_corpus(1).sha256()


@pytest.mark.model_free
def test_corpus_contributions_come_from_entry_points_with_their_own_rng() -> None:
    """The scenarios' text comes from the corpus parts (`corpus.CONTRIBUTIONS`); adding a contribution leaves every
    other contribution's text as it was (each has its own rng stream), and bad stages are refused."""
    assert contributions()["demo-add"] is demo_corpus.contribution
    extra_chat = [{"role": "user", "content": "ping"}, {"role": "assistant", "content": "pong"}]
    before = build_corpus(0)
    after = build_corpus(0, extra={"zz-extra": lambda rng: {"learn": [extra_chat] * rng.randint(1, 3)}})
    demo_learn = demo_corpus.contribution(random.Random("0:demo-add"))["learn"]
    for corpus in (before, after):
        assert corpus.stages[0].chats[: len(demo_learn)] == demo_learn
    assert extra_chat in after.stages[0].chats and extra_chat not in before.stages[0].chats
    assert after.stages[1].chats == before.stages[1].chats  # nothing added to "calibrate"
    with pytest.raises(ValueError, match="unknown stages"):
        build_corpus(0, extra={"bad": lambda rng: {"pretrain": []}})


@pytest.mark.model_free
def test_saved_files_and_metadata(quick_model: Path) -> None:
    names = {p.name for p in quick_model.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    assert not list(quick_model.parent.glob(".*building*")), "staging folder left behind"
    meta = json.loads((quick_model / tiny.METADATA_FILE).read_text())
    assert meta["seed"] == 1 and meta["steps"] == QUICK_STEPS
    assert meta["weights_sha256"] == tiny.weights_sha256(quick_model)
    assert meta["corpus_sha256"] == build_corpus(1).sha256()
    packaged = {n for n, s in packaged_scenarios().items() if s.eval is not None and s.reward is not None}
    assert set(meta["eval"]) == packaged and "demo-add" in packaged  # every packaged scenario with an eval suite
    assert set(meta["eval"]["demo-add"]) == {"heldout_success_temp1", "heldout_success_greedy", "train_success_temp1"}


@pytest.mark.model_free
def test_a_model_from_another_corpus_is_stale(quick_model: Path, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """`make test` and `make demo` rebuild only a stale model: another seed, step count or corpus
    (a changed corpus part after a pull) makes it stale."""
    assert tiny.is_current(quick_model, seed=1, steps=QUICK_STEPS)
    assert not tiny.is_current(quick_model, seed=2, steps=QUICK_STEPS)
    assert not tiny.is_current(quick_model, seed=1, steps=QUICK_STEPS + 1)
    assert not tiny.is_current(tmp_path / "missing")
    other = tmp_path / "other"
    shutil.copytree(quick_model, other)
    meta = json.loads((other / tiny.METADATA_FILE).read_text())
    (other / tiny.METADATA_FILE).write_text(json.dumps({**meta, "corpus_sha256": build_corpus(7).sha256()}))
    assert not tiny.is_current(other, seed=1, steps=QUICK_STEPS)
    assert tiny.main_build_tiny(["--out", str(quick_model), "--seed", "1", "--steps", str(QUICK_STEPS),
                                 "--if-stale"]) == 0
    assert "up to date" in capsys.readouterr().err


@pytest.mark.model_free
def test_output_head_is_untied(quick_model: Path) -> None:
    """vLLM CPU's `reload_weights` leaves a tied lm_head stale, so full-weight releases need a
    separate `lm_head.weight` in the checkpoint (and a config that says so)."""
    assert json.loads((quick_model / "config.json").read_text())["tie_word_embeddings"] is False
    with safe_open(quick_model / "model.safetensors", "pt") as f:
        assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(f.keys())
        assert not torch.equal(f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight"))


@pytest.mark.model_free
def test_chat_template_renders_chatml(quick_model: Path) -> None:
    tok = AutoTokenizer.from_pretrained(quick_model)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    # No default system prompt is injected, and no generation prompt unless asked for.
    assert tok.apply_chat_template(messages[1:], tokenize=False) == "<|im_start|>user\nHi!<|im_end|>\n"
    # Special tokens are single tokens; eos is <|im_end|>, which generation stops on.
    ids = tok.encode("<|im_start|>user\nHi!<|im_end|>", add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert ids[-1] == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.pad_token == "<|endoftext|>"
    assert GenerationConfig.from_pretrained(quick_model).eos_token_id == tok.eos_token_id
    # The trainer's per-message encoding is exactly the tokenization of the rendered chat.
    chat = [*demo.eval_tasks()[0].messages, {"role": "assistant", "content": "Answer: 3"}]
    ids, labels = tiny.encode_chat(tok, chat)
    assert ids == tok.encode(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)
    trained = [i for i, label in zip(ids, labels, strict=True) if label != -100]
    assert tok.decode(trained) == "Answer: 3<|im_end|>"


@pytest.mark.model_free
def test_model_loads_and_generates(quick_model: Path) -> None:
    tok = AutoTokenizer.from_pretrained(quick_model)
    model = AutoModelForCausalLM.from_pretrained(quick_model)
    assert model.config.model_type == "qwen2"
    assert model.config.eos_token_id == tok.eos_token_id
    replies = tiny.generate_replies(model, tok, [demo.eval_tasks()[0].messages], temperature=1.0, samples=2)
    assert len(replies) == 1 and len(replies[0]) == 2


# --- demo task -----------------------------------------------------------------------------------


@pytest.mark.model_free
def test_verifier_scores() -> None:
    task = demo.make_task(3, 4, 0)
    assert task.answer == 7
    assert task.messages[-1] == {"role": "user", "content": "What is 3 + 4?"}
    assert demo.score(task, "Answer: 7") == 1.0
    assert demo.score(task, "Sure. Answer:7\n") == 1.0
    assert demo.score(task, "Answer: 8") == 0.0
    assert demo.score(task, "Answer: 70") == 0.0
    assert demo.score(task, "7") == 0.0  # the format is part of the task
    assert demo.score(task, "Answer: 8. No wait, Answer: 7") == 0.0  # the first answer counts
    assert demo.score(task, "") == 0.0
    assert demo.score_shaped(task, "Answer: 7") == 1.0
    assert 0.1 < demo.score_shaped(task, "Answer: 8") < demo.score_shaped(task, "Answer: 7")
    assert demo.score_shaped(task, "Answer: 8") > demo.score_shaped(task, "Answer: 18") >= 0.1
    assert demo.score_shaped(task, "seven") == 0.0


@pytest.mark.model_free
def test_train_and_eval_are_disjoint_and_stable() -> None:
    train, held_out = demo.train_tasks(0), demo.eval_tasks()
    assert len(train) == 320 and len(held_out) == 80
    pair = lambda t: tuple(t.task_id.split("-")[1:3])  # noqa: E731
    assert not {pair(t) for t in train} & {pair(t) for t in held_out}
    user_prompts = lambda ts: {t.messages[-1]["content"] for t in ts}  # noqa: E731
    assert not user_prompts(train) & user_prompts(held_out)
    assert len({t.task_id for t in train + held_out}) == 400
    # The split never moves; a seed only reorders the train prompts.
    assert [t.task_id for t in demo.eval_tasks()] == [t.task_id for t in held_out]
    assert {t.task_id for t in demo.train_tasks(1)} == {t.task_id for t in train}
    assert [t.task_id for t in demo.train_tasks(1)] != [t.task_id for t in train]
    # Every held-out answer is also an answer some train prompt is rewarded for.
    assert {t.answer for t in held_out} <= {t.answer for t in train}


# --- the default model: weak, but learnable ------------------------------------------------------


def _rejection_sampling_round(model, tok, suite: EvalSuite, seed: int) -> None:
    """Sample 4 replies per prompt of `suite`, fine-tune on the ones its reward scores 1 (~2 epochs)."""
    replies = tiny.generate_replies(model, tok, suite.prompts, temperature=1.0, samples=4, seed=seed,
                                    max_new_tokens=suite.max_new_tokens)
    docs = [
        tiny.encode_chat(tok, [*t["messages"], {"role": "assistant", "content": r}])
        for t, rs, scores in zip(suite.tasks, replies, suite.score(replies), strict=True)
        for r, score in zip(rs, scores, strict=True)
        if score.value == 1.0
    ]
    assert docs, "the base model never samples a right answer: RL would get no signal"
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    rng = random.Random(seed)
    model.train()
    for _ in range(max(1, len(docs) // 8)):
        batch = rng.sample(docs, min(16, len(docs)))
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [tok.pad_token_id] * (width - len(i)) for i, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def _train_suite(scenario: Scenario, round_: int) -> EvalSuite:
    """The scenario's training prompts (never its eval rows), shuffled per round, with its reward."""
    tasks = training_tasks(scenario)
    random.Random(round_).shuffle(tasks)
    return EvalSuite(tasks=tasks, reward=reward_for(scenario), max_new_tokens=scenario.eval.max_new_tokens)


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # several times faster for a model this small
    yield
    torch.set_num_threads(threads)


def test_default_model_is_weak_but_learnable(tiny_model: Path, one_thread: None) -> None:
    meta = json.loads((tiny_model / tiny.METADATA_FILE).read_text())
    assert meta["corpus_sha256"] == build_corpus(meta["seed"]).sha256(), (
        f"{tiny_model} was built from another corpus: rebuild it (make model / python -m tests.helpers.tiny.model)"
    )
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    scenario = get_scenario("demo-add")
    suite = eval_suite(scenario)
    # What `tiny.evaluate_model` measures for demo-add (same samples and seeds), without the other scenarios.
    base = {"heldout_success_temp1": tiny.success_rate(model, tok, suite, temperature=1.0,
                                                       samples=tiny.EVAL_SAMPLES_PER_TASK, seed=0),
            "heldout_success_greedy": tiny.success_rate(model, tok, suite, temperature=0.0)}
    assert 0.05 <= base["heldout_success_temp1"] <= 0.30, base
    assert base["heldout_success_greedy"] <= 0.30, base

    for round_ in range(2):
        _rejection_sampling_round(model, tok, _train_suite(scenario, round_), seed=round_)
    learned = tiny.success_rate(model, tok, suite, temperature=1.0, samples=4, seed=99)
    assert learned >= 0.8, f"held-out success after 2 rounds of rejection sampling: {learned:.2f}"
