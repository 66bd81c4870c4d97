"""Shared pieces of the SmolLM2-135M probe: tasks (generators + binary verifiers), batched
generation, evaluation, and a tiny LoRA SFT loop (peft, fp32, CPU).

Everything is deterministic given the seeds. Tasks come with a train split and a held-out split
whose *content words* are disjoint (held-out items use products / names / ids never seen in train).
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "2")
import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))

MODEL = "/work/main/data/models/smollm2-135m-instruct"


@dataclass
class Item:
    user: str
    answer: Any  # what the verifier checks against
    target: str  # the hindsight / demonstration reply
    tools: list[dict] | None = None


@dataclass
class Task:
    name: str
    train: list[Item]
    heldout: list[Item]
    verify: Callable[[str, Item], bool]
    system: str  # harness: format-stating system prompt
    shots: list[Item] = field(default_factory=list)  # harness: few-shot examples (from train)


# --------------------------------------------------------------------------- demo: sentiment
POS_ADJ = ["great", "excellent", "wonderful", "fantastic", "amazing", "perfect", "lovely", "superb",
           "reliable", "sturdy", "comfortable", "brilliant", "solid", "delightful", "impressive", "handy"]
NEG_ADJ = ["terrible", "awful", "broken", "useless", "flimsy", "disappointing", "horrible", "cheap",
           "faulty", "noisy", "uncomfortable", "defective", "poor", "annoying", "worthless", "leaky"]
POS_TAIL = ["I love it.", "Would buy again.", "Highly recommend.", "Five stars.", "Very happy with it.",
            "Works like a charm.", "Best purchase this year.", "My family loves it too."]
NEG_TAIL = ["I want a refund.", "Would not buy again.", "Do not recommend.", "One star.",
            "Very unhappy with it.", "It stopped working after a day.", "Waste of money.",
            "Returning it tomorrow."]
PRODUCTS = ["kettle", "toaster", "blender", "lamp", "backpack", "umbrella", "keyboard", "mouse",
            "headphones", "speaker", "charger", "phone case", "water bottle", "desk chair", "jacket",
            "pair of boots", "frying pan", "coffee maker", "vacuum", "hair dryer", "monitor", "tent",
            "sleeping bag", "yoga mat", "watch", "wallet", "suitcase", "drill", "printer", "router",
            "bike lock", "rice cooker", "scarf", "pillow", "blanket", "thermos", "microwave", "fan",
            "heater", "camera"]
REVIEW_FMT = ["This {p} is {a}. {t}", "The {p} arrived and it is {a}. {t}", "{a_cap} {p}! {t}",
              "I bought this {p} last week. It is {a}. {t}", "Honestly, a {a} {p}. {t}"]


def _split_products(seed: int = 0) -> tuple[list[str], list[str]]:
    prods = PRODUCTS[:]
    random.Random(seed).shuffle(prods)
    return prods[:28], prods[28:]  # 28 train products, 12 held-out products


def _review(rng: random.Random, prods: list[str], label: str) -> str:
    adj = rng.choice(POS_ADJ if label == "positive" else NEG_ADJ)
    tail = rng.choice(POS_TAIL if label == "positive" else NEG_TAIL)
    return rng.choice(REVIEW_FMT).format(p=rng.choice(prods), a=adj, a_cap=adj.capitalize(), t=tail)


LABEL_RE = re.compile(r"^\s*Label:\s*(positive|negative)\s*\.?\s*$")


def verify_label(reply: str, item: Item) -> bool:
    m = LABEL_RE.match(reply)
    return bool(m) and m.group(1) == item.answer


def demo_task(n_train: int = 256, n_heldout: int = 64, seed: int = 0) -> Task:
    tr_p, ho_p = _split_products(seed)
    def make(n: int, prods: list[str], s: int) -> list[Item]:
        rng = random.Random(s)
        out = []
        for i in range(n):
            lab = "positive" if i % 2 == 0 else "negative"
            out.append(Item(f"Review: {_review(rng, prods, lab)}\nIs this review positive or negative?",
                            lab, f"Label: {lab}"))
        rng.shuffle(out)
        return out
    train = make(n_train, tr_p, seed + 1)
    return Task("demo", train, make(n_heldout, ho_p, seed + 2), verify_label,
                system="You classify product reviews. Reply with exactly one line: "
                       "`Label: positive` or `Label: negative`. No other words.",
                shots=[train[i] for i in _two_labels(train)])


def _two_labels(train: list[Item]) -> list[int]:
    seen, idx = set(), []
    for i, it in enumerate(train):
        if it.answer not in seen:
            seen.add(it.answer)
            idx.append(i)
    for i, it in enumerate(train):  # then 2 more, alternating
        if len(idx) >= 4:
            break
        if i not in idx and it.answer != train[idx[-1]].answer:
            idx.append(i)
    return idx[:4]


# --------------------------------------------------------------------------- reviews: category
CATS = {
    "electronics": ["headphones", "charger", "laptop", "speaker", "keyboard", "monitor", "router",
                    "phone", "tablet", "camera", "earbuds", "power bank"],
    "kitchen": ["kettle", "blender", "frying pan", "toaster", "knife set", "rice cooker", "coffee maker",
                "mixing bowl", "cutting board", "saucepan", "teapot", "spatula"],
    "clothing": ["jacket", "t-shirt", "pair of jeans", "sweater", "scarf", "dress", "pair of socks",
                 "hoodie", "coat", "skirt", "hat", "pair of gloves"],
    "books": ["novel", "cookbook", "biography", "poetry collection", "comic book", "textbook",
              "mystery novel", "travel guide", "history book", "fantasy novel", "memoir", "atlas"],
}
CAT_FMT = ["I bought a {p}. It is {a}.", "This {p} is {a}, {t}", "My new {p} is {a}.",
           "The {p} I ordered is {a}. {t}", "Got this {p} as a gift; it is {a}."]


def verify_category(reply: str, item: Item) -> bool:
    m = re.match(r"^\s*Category:\s*([a-z]+)\s*\.?\s*$", reply)
    return bool(m) and m.group(1) == item.answer


def reviews_task(n_train: int = 256, n_heldout: int = 64, seed: int = 0) -> Task:
    # 8 products per category for train, 4 for held-out
    tr = {c: ps[:8] for c, ps in CATS.items()}
    ho = {c: ps[8:] for c, ps in CATS.items()}
    cats = list(CATS)
    def make(n: int, prods: dict[str, list[str]], s: int) -> list[Item]:
        rng = random.Random(s)
        out = []
        for i in range(n):
            c = cats[i % 4]
            pos = rng.random() < 0.5
            a = rng.choice(POS_ADJ if pos else NEG_ADJ)
            t = rng.choice(POS_TAIL if pos else NEG_TAIL)
            txt = rng.choice(CAT_FMT).format(p=rng.choice(prods[c]), a=a, t=t)
            out.append(Item(f"Review: {txt}\nWhich category is the product: electronics, kitchen, "
                            f"clothing or books?", c, f"Category: {c}"))
        rng.shuffle(out)
        return out
    train = make(n_train, tr, seed + 11)
    shots, seen = [], set()
    for it in train:
        if it.answer not in seen:
            seen.add(it.answer)
            shots.append(it)
    return Task("reviews", train, make(n_heldout, ho, seed + 12), verify_category,
                system="You sort product reviews into categories. Reply with exactly one line: "
                       "`Category: electronics`, `Category: kitchen`, `Category: clothing` or "
                       "`Category: books`. No other words.",
                shots=shots)


# --------------------------------------------------------------------------- rules: order-id extraction
FIRST = ["Anna", "Ben", "Carla", "Dev", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kai",
         "Lena", "Marco", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara"]
ORDER_FMT = [
    "Hi, this is {n}. My order {o} has not arrived yet. Can you check?",
    "Hello, I'm {n}. I want to return the item from order {o}, it is broken.",
    "{n} here. Order {o} was charged twice, please help.",
    "Hey, order number {o} shows delivered but I got nothing. Thanks, {n}",
    "Good morning, {n} writing. Could you change the address on order {o}?",
    "Dear support, my package for order {o} is damaged. Regards, {n}",
]


def verify_order(reply: str, item: Item) -> bool:
    return reply.strip().rstrip(".") == item.target


def rules_task(n_train: int = 256, n_heldout: int = 64, seed: int = 0) -> Task:
    def make(n: int, names: list[str], lo: int, hi: int, s: int) -> list[Item]:
        rng = random.Random(s)
        out = []
        for _ in range(n):
            o = f"{rng.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}{rng.randrange(lo, hi)}"
            msg = rng.choice(ORDER_FMT).format(n=rng.choice(names), o=o)
            out.append(Item(f"Message: {msg}\nExtract the order id and the customer name.",
                            o, f"ORDER {o} | NAME {_name_in(msg, names)}"))
        return out
    train = make(n_train, FIRST[:14], 10000, 60000, seed + 21)
    return Task("rules", train, make(n_heldout, FIRST[14:], 60000, 99999, seed + 22), verify_order,
                system="You extract fields from support messages. Reply with exactly one line in the "
                       "form `ORDER <order id> | NAME <first name>`, for example `ORDER K12345 | NAME "
                       "Maria`. No other words.",
                shots=train[:3])


def _name_in(msg: str, names: list[str]) -> str:
    return next(n for n in names if n in msg)


# --------------------------------------------------------------------------- shop: tool call
SHOP_TOOLS = [
    {"type": "function", "function": {
        "name": "get_order_status", "description": "Look up the shipping status of an order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                       "required": ["order_id"]}}},
    {"type": "function", "function": {
        "name": "search_products", "description": "Search the shop catalogue for products.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]}}},
]
SHOP_ORDER = ["Where is my order {o}?", "Can you check the status of order {o}?",
              "Has order {o} shipped yet?", "What's happening with my order {o}?"]
SHOP_SEARCH = ["Do you sell {p}?", "I'm looking for a {p}.", "Show me some {p} options.",
               "Can you find me a {p}?"]

TOOL_RE = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def parse_tool_call(reply: str) -> dict | None:
    m = TOOL_RE.search(reply + ("</tool_call>" if "</tool_call>" not in reply else ""))
    if not m:
        return None
    try:
        obj = json.loads(m.group(1))
    except Exception:
        return None
    return obj if isinstance(obj, dict) else None


def verify_tool(reply: str, item: Item) -> bool:
    obj = parse_tool_call(reply)
    if not obj:
        return False
    name, key, val = item.answer
    args = obj.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except Exception:
            return False
    return obj.get("name") == name and isinstance(args, dict) and \
        str(args.get(key, "")).strip().lower() == val.lower()


def shop_task(n_train: int = 256, n_heldout: int = 64, seed: int = 0) -> Task:
    tr_p, ho_p = _split_products(seed)
    def make(n: int, prods: list[str], lo: int, hi: int, s: int) -> list[Item]:
        rng = random.Random(s)
        out = []
        for i in range(n):
            if i % 2 == 0:
                o = str(rng.randrange(lo, hi))
                u, ans = rng.choice(SHOP_ORDER).format(o=o), ("get_order_status", "order_id", o)
            else:
                p = rng.choice(prods)
                u, ans = rng.choice(SHOP_SEARCH).format(p=p), ("search_products", "query", p)
            tgt = '<tool_call>\n{{"name": "{}", "arguments": {{"{}": "{}"}}}}\n</tool_call>'.format(*ans)
            out.append(Item(u, ans, tgt, tools=SHOP_TOOLS))
        rng.shuffle(out)
        return out
    train = make(n_train, tr_p, 10000, 60000, seed + 31)
    shots = [next(t for t in train if t.answer[0] == "get_order_status"),
             next(t for t in train if t.answer[0] == "search_products")]
    return Task("shop", train, make(n_heldout, ho_p, 60000, 99999, seed + 32), verify_tool,
                system="You are a shop assistant. Always answer by calling exactly one tool. "
                       "Put the call inside <tool_call></tool_call> tags as JSON with \"name\" and "
                       "\"arguments\". Do not write anything else.",
                shots=shots)


TASKS = {"demo": demo_task, "reviews": reviews_task, "rules": rules_task, "shop": shop_task}


# --------------------------------------------------------------------------- prompting
def messages(task: Task, item: Item, mode: str = "base") -> list[dict]:
    """mode: base (default template system prompt), system (format system prompt),
    fewshot (format system prompt + shots as prior turns), shots (default system + shots)."""
    msgs: list[dict] = []
    if mode in ("system", "fewshot"):
        msgs.append({"role": "system", "content": task.system})
    if mode in ("fewshot", "shots"):
        for s in task.shots:
            msgs += [{"role": "user", "content": s.user}, {"role": "assistant", "content": s.target}]
    msgs.append({"role": "user", "content": item.user})
    return msgs


def render(tok, task: Task, item: Item, mode: str = "base") -> str:
    return tok.apply_chat_template(messages(task, item, mode), tools=item.tools,
                                   add_generation_prompt=True, tokenize=False)


def load(adapter: str | None = None):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(MODEL)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    model.eval()
    return tok, model


@torch.no_grad()
def generate(tok, model, prompts: list[str], temperature: float, max_new: int, bs: int = 32,
             seed: int = 0) -> list[str]:
    out: list[str] = []
    torch.manual_seed(seed)
    for i in range(0, len(prompts), bs):
        enc = tok(prompts[i:i + bs], return_tensors="pt", padding=True, add_special_tokens=False)
        kw: dict[str, Any] = dict(max_new_tokens=max_new, pad_token_id=tok.pad_token_id,
                                  eos_token_id=tok.eos_token_id)
        if temperature > 0:
            kw.update(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
        else:
            kw.update(do_sample=False)
        g = model.generate(**enc, **kw)
        out += tok.batch_decode(g[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return out


def evaluate(tok, model, task: Task, mode: str, temperature: float, max_new: int,
             items: list[Item] | None = None, seed: int = 0) -> tuple[float, list[str], float]:
    items = task.heldout if items is None else items
    t0 = time.time()
    replies = generate(tok, model, [render(tok, task, it, mode) for it in items], temperature,
                       max_new, seed=seed)
    ok = [task.verify(r, it) for r, it in zip(replies, items, strict=False)]
    return sum(ok) / len(ok), replies, time.time() - t0


# --------------------------------------------------------------------------- LoRA SFT
def add_lora(model, r: int = 16, alpha: int = 32):
    from peft import LoraConfig, get_peft_model
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                     "down_proj"])
    return get_peft_model(model, cfg)


def sft(tok, model, examples: list[tuple[str, str]], steps: int, lr: float, bs: int = 8,
        seed: int = 0, log: Callable[[str], None] = print,
        eval_cb: Callable[[int], None] | None = None, eval_every: int = 0) -> list[dict]:
    """examples: (rendered prompt, completion). Loss on completion + <|im_end|> only."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                            weight_decay=0.0)
    tok.padding_side = "right"
    stats = []
    order: list[int] = []
    model.train()
    for step in range(1, steps + 1):
        if len(order) < bs:
            more = list(range(len(examples)))
            rng.shuffle(more)
            order += more
        batch = [examples[order.pop()] for _ in range(bs)]
        ids, labs = [], []
        for p, c in batch:
            pi = tok(p, add_special_tokens=False)["input_ids"]
            ci = tok(c + "<|im_end|>", add_special_tokens=False)["input_ids"]
            ids.append(pi + ci)
            labs.append([-100] * len(pi) + ci)
        L = max(map(len, ids))
        inp = torch.full((bs, L), tok.pad_token_id)
        lab = torch.full((bs, L), -100)
        att = torch.zeros((bs, L), dtype=torch.long)
        for j, (a, b) in enumerate(zip(ids, labs, strict=False)):
            inp[j, :len(a)] = torch.tensor(a)
            lab[j, :len(b)] = torch.tensor(b)
            att[j, :len(a)] = 1
        t0, c0 = time.time(), time.process_time()
        loss = model(input_ids=inp, attention_mask=att, labels=lab).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        dt, dc = time.time() - t0, time.process_time() - c0
        ntok = int(att.sum())
        stats.append({"step": step, "loss": float(loss), "wall_s": dt, "cpu_s": dc, "tokens": ntok,
                      "tok_per_s": ntok / dt})
        if step % 5 == 0 or step == 1:
            log(f"  step {step:3d} loss {float(loss):.3f} wall {dt:.2f}s cpu {dc:.2f}s "
                f"{ntok} tok {ntok / dt:.0f} tok/s")
        if eval_cb and eval_every and step % eval_every == 0 and step < steps:
            model.eval()
            tok.padding_side = "left"
            eval_cb(step)
            tok.padding_side = "right"
            model.train()
    model.eval()
    tok.padding_side = "left"
    return stats
