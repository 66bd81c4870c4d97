"""The lineage graph as DOT: releases, their content (weights, harness, a routing release's canary
arm), candidate, snapshot, recipe, params, base model, code and the DVC stages that produced them."""

from __future__ import annotations

import json
from typing import Any

COLOURS = {"release": "#4c78a8", "content": "#9d755d", "candidate": "#54a24b", "snapshot": "#f58518",
           "recipe": "#b279a2", "params": "#bab0ac", "base": "#72b7b2", "code": "#eeca3b", "dvc": "#e45756",
           "harness": "#ff9da6"}


def _q(text: Any) -> str:
    return json.dumps(str(text), ensure_ascii=False)  # a DOT string literal: quotes and backslashes escaped


class _Dot:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.nodes: set[str] = set()

    def node(self, key: str, label: str, kind: str, **attrs: str) -> str:
        if key not in self.nodes:
            self.nodes.add(key)
            extra = "".join(f", {k}={_q(v)}" for k, v in attrs.items())
            self.lines.append(f'  {_q(key)} [label={_q(label)}, color={_q(COLOURS[kind])}, '
                              f'fillcolor={_q(COLOURS[kind] + "33")}{extra}];')
        return key

    def edge(self, a: str, b: str, label: str = "", **attrs: str) -> None:
        extra = "".join(f", {k}={_q(v)}" for k, v in attrs.items())
        self.lines.append(f"  {_q(a)} -> {_q(b)} [label={_q(label)}{extra}];")

    def render(self) -> str:
        head = ["digraph lineage {", "  rankdir=RL;",
                '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
                '  edge [fontname="Helvetica", fontsize=9, color="#777777"];']
        return "\n".join(head + self.lines + ["}"])


def _params_label(params: dict[str, Any] | None, limit: int = 8) -> str:
    if not params:
        return "params: -"
    items = [f"{k} = {v}" for k, v in sorted(params.items()) if not isinstance(v, dict | list)][:limit]
    return "params\n" + "\n".join(items) if items else "params"


def lineage_dot(chain: list[dict[str, Any]], release_id: str, depth: int, candidates: dict[str, dict[str, Any]],
                manifests: dict[str, dict[str, Any] | None], dvc_stages: dict[str, Any]) -> str:
    """`release_id` and up to `depth` of its ancestors, each with where its content came from."""
    by_id = {r["release_id"]: r for r in chain}
    path = [by_id[release_id]]
    while len(path) <= depth and path[-1].get("parent_release_id") in by_id:
        path.append(by_id[path[-1]["parent_release_id"]])
    g = _Dot()
    # Releases first, so that a lineage's parent_release that is on the path links to its node.
    for r in path:
        approved = f"\nby {r['approved_by']}" if r.get("approved_by") else ""
        g.node(r["release_id"], f"{r['release_id']}\n{r['operation']} · {r['kind']}{approved}", "release",
               penwidth="2.5" if r["release_id"] == release_id else "1")
    for r in path:
        rid = r["release_id"]
        if r.get("parent_release_id"):
            parent = r["parent_release_id"]
            if parent not in g.nodes:
                g.node(parent, parent, "release", style="rounded,dashed")
            g.edge(rid, parent, "parent")
        if r.get("restores"):
            g.edge(rid, r["restores"] if r["restores"] in g.nodes else g.node(r["restores"], r["restores"], "release"),
                   "restores", style="dashed")
        content = r["content_id"]
        manifest = manifests.get(content) or {}
        size = sum(f["size"] for f in manifest.get("files", [])) / 1e6
        cnode = g.node(f"content:{content}", f"{r['kind']} artifact\n{content[:12]}"
                       + (f"\n{len(manifest.get('files', []))} files, {size:.1f} MB" if manifest else ""), "content")
        g.edge(rid, cnode, "serves")
        if r.get("harness_id"):
            tree = r["harness_id"]
            hcand = candidates.get(tree)
            hnode = g.node(f"content:{tree}", f"harness\n{tree[:12]}" + (
                f"\ncandidate {hcand['status']}" if hcand else ""), "harness")
            g.edge(rid, hnode, "harness")
        split = next((a for a in (r.get("routing") or {}).get("arms") or [] if a["arm"] == "candidate"), None)
        if split is not None:  # a routing release: a share of the traffic goes to a canary candidate
            arm = split["content_id"]
            g.edge(rid, g.node(f"content:{arm}", f"lora artifact\n{arm[:12]}", "content"),
                   f"canary {split['share']:.0%}", style="dashed")
        cand = candidates.get(content)
        lineage = r.get("lineage") or (cand or {}).get("lineage") or manifest.get("lineage") or {}
        origin = cnode
        if cand is not None:
            gate = cand.get("gate") or {}
            verdict = f"\ngate {gate['decision']} {gate.get('delta', 0):+.3f}" if gate else ""
            origin = g.node(f"candidate:{content}", f"candidate {content[:12]}\n{cand['status']}{verdict}", "candidate")
            g.edge(cnode, origin, "registered as")
        if lineage.get("snapshot_id") or lineage.get("snapshot_hash"):
            snap = lineage.get("snapshot_id") or lineage["snapshot_hash"][:12]
            snode = g.node(f"snapshot:{snap}", f"snapshot {snap}" + (
                f"\n{lineage['snapshot_hash'][:12]}" if lineage.get("snapshot_hash") else ""), "snapshot")
            g.edge(origin, snode, "trained on")
            if lineage.get("parent_release"):
                parent = lineage["parent_release"]
                if parent not in g.nodes:
                    g.node(parent, parent, "release", style="rounded,dashed")
                g.edge(snode, parent, "taken while serving", style="dotted")
            if dvc_stages.get("snapshot"):
                g.edge(snode, g.node("dvc:snapshot", "dvc stage: snapshot", "dvc"), "dvc.lock", style="dotted")
        if lineage.get("recipe"):
            rnode = g.node(f"recipe:{rid}", f"recipe\n{lineage['recipe']}", "recipe")
            g.edge(origin, rnode, "recipe")
            pnode = g.node(f"params:{rid}", _params_label(lineage.get("params")), "params")
            g.edge(rnode, pnode, "params")
            if dvc_stages.get("train"):
                g.edge(origin, g.node("dvc:train", "dvc stage: train", "dvc"), "dvc.lock", style="dotted")
        if lineage.get("base_model"):
            base = lineage["base_model"]
            g.edge(origin, g.node(f"base:{base}", f"base model\n{base}", "base"), "base")
        if lineage.get("code_commit"):
            commit = lineage["code_commit"]
            g.edge(origin, g.node(f"code:{commit}", f"code {commit[:12]}", "code"), "code")
    _dvc(g, dvc_stages)
    return g.render()


def _dvc(g: _Dot, stages: dict[str, Any]) -> None:
    """The DVC stages of dvc.lock, each linked to the stages whose outputs it depends on."""
    if not stages:
        return
    outs: dict[str, str] = {}
    for name, stage in stages.items():
        for out in stage.get("outs") or []:
            outs[out.get("path", "")] = name
    for name, stage in stages.items():
        outs_md5 = ", ".join((o.get("md5") or "")[:8] for o in stage.get("outs") or [] if o.get("md5"))
        label = f"dvc stage: {name}" + (f"\nouts {outs_md5}" if outs_md5 else "")
        g.node(f"dvc:{name}", label, "dvc")
    for name, stage in stages.items():
        for dep in stage.get("deps") or []:
            path = dep.get("path", "")
            for out_path, producer in outs.items():
                if producer != name and out_path and (path == out_path or path.startswith(out_path + "/")):
                    g.edge(f"dvc:{name}", f"dvc:{producer}", "needs")
