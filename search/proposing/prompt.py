"""What the model sees: the target's rules, the knob domain, the history, and the proposal tool."""

from __future__ import annotations

import itertools
import json
from functools import lru_cache

from fa4tune.config import ProblemClass
from fa4tune.feasibility import forward_smem_bytes
from fa4tune.kernel_class import backward_kernels, forward_kernels
from fa4tune.targets import Target
from search.proposing.proposer import Context, Rejection
from search.space import get_space
from search.storing.history import FINISHED, TrialRecord, config_key, measured

DEFAULT_MODEL = "claude-sonnet-5-5"  # the Claude model this prompt is written for, and `search run`'s default
TOOL_NAME = "propose_configs"
MAX_LISTED_FEASIBLE = 200  # unmeasured feasible configs listed in the prompt, at most
MAX_RATIONALE_CHARS = 600

# Upstream's can_implement formula: the rule that shapes the space most, spelled out. The other rules are
# listed from fa4tune.feasibility itself (rule_examples), so the prompt cannot drift from the checks.
_SMEM_FORMULA = {
    "fwd": "Q = tile_m*head_dim*2 B, K = tile_n*head_dim*num_stages*2 B, V = tile_n*head_dim_v*num_stages*2 B; "
           "Q + K + V (or max(Q, V) + K when Q_in_regs) must fit in {smem} B.",
    "bwd": "Q = m_block_size*head_dim*num_stages_Q*2 B, dO = m_block_size*head_dim_v*num_stages_dO*2 B, "
           "K = n_block_size*head_dim*2 B, V = n_block_size*head_dim_v*2 B; Q + V + dO + K (or max(Q, V) + dO + K "
           "when V_in_regs) must fit in {smem} B.",
}

_KERNEL = {
    "fwd": "of FlashAttention-4's SM120 forward (SM80 mma.sync math; the `kernel` knob names the kernel class, listed below)",
    "bwd": "of FlashAttention-4's SM120 backward, FlashAttentionBackwardSm120 (SM80 mma.sync math; where a `kernel` "
           "knob is listed, it names the kernel class, listed below)",
}


def tool(context: Context) -> dict:
    """The proposal tool: a JSON schema whose knob properties list exactly the domain's values."""
    knobs = {name: {"enum": list(values)} for name, values in context.space.domain.items()}
    own = {name for names in context.space.kernel_knobs.values() for name in names}  # only their class's configs have them
    required = [name for name, values in context.space.domain.items() if len(values) > 1 and name not in own]
    return {
        "name": TOOL_NAME,
        "description": f"Propose {context.k} new configs to measure next, each with a one-paragraph rationale.",
        "input_schema": {
            "type": "object",
            "properties": {
                "proposals": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": context.k,
                    "items": {
                        "type": "object",
                        "properties": {
                            "config": {"type": "object", "properties": knobs, "required": required, "additionalProperties": False},
                            "rationale": {"type": "string", "description": "One paragraph: what you expect and why, citing the history."},
                        },
                        "required": ["config", "rationale"],
                    },
                }
            },
            "required": ["proposals"],
        },
    }


def system_prompt(context: Context) -> str:
    """The role, the target's rules and the knob domain."""
    direction = context.space.direction
    rules = "\n".join(f"- {rule}: {example}" for rule, example in rule_examples(direction, context.problem_class, context.target))
    domain = "\n".join(f"- {name}: {', '.join(map(json.dumps, values))}" for name, values in context.space.domain.items())
    return f"""\
You tune the configs {_KERNEL[direction]}, written in the CuTe DSL, for one problem class.
You propose configs; a harness checks each one against static rules, then measures it on a GPU (a correctness
gate, then timing). The objective is the geometric mean of TFLOPS over the problem class's problems; higher is
better. Measurements may come from the SM120 kernels emulated on another GPU: the rules are the target's, the speed
is the measuring device's.

Target: {context.target.description}; {context.target.smem_per_block} B of shared memory per block.
Shared memory (upstream's can_implement): {_SMEM_FORMULA[direction].format(smem=context.target.smem_per_block)}
Static rules that reject configs of this domain for this problem class (a rejected config never reaches the GPU),
each with one example rejection:
{rules}

Knobs and their allowed values:
{domain}{_kernel_classes(context)}

Answer only by calling the {TOOL_NAME} tool with {context.k} configs that have not been measured yet, each with a
one-paragraph rationale that says what you expect and why, citing the history."""


def _kernel_classes(context: Context) -> str:
    """The direction's kernel classes, each with its docstring's first line and its own knobs (read from the classes)."""
    if not context.space.kernel_knobs:
        return ""
    lines = ["", "Kernel classes (the `kernel` knob); a class's own knobs apply to its configs only, and are required there:"]
    registry = forward_kernels() if context.space.direction == "fwd" else backward_kernels()
    for name, cls in registry.items():
        if name in context.space.domain.get("kernel", ()):
            doc = (cls.__doc__ or cls.__name__).strip().splitlines()[0].rstrip(".")
            own = f"; own knobs: {', '.join(cls.knobs)}" if cls.knobs else ""
            lines.append(f"- {name}: {doc}{own}")
    return "\n".join(lines)


def user_message(context: Context, rejections: list[Rejection]) -> str:
    """The problem class, its problems, upstream's default, the history and last turn's rejections."""
    pc = context.problem_class
    lines = [
        f"Problem class {pc.name}: head_dim {pc.head_dim}, head_dim_v {pc.head_dim_v}, "
        f"{'causal' if pc.causal else 'non-causal'}, qhead_per_kvhead {pc.qhead_per_kvhead}, {pc.dtype}.",
        "Problems (the objective is the geomean of their TFLOPS):",
        *(f"- {p.label}" for p in context.problems),
        f"Upstream's default config: {json.dumps(context.space.upstream(pc).to_dict())}",
        "",
        f"History ({len(context.history)} trials, oldest first):" if context.history else "History: no trials yet.",
        # duplicates carry nothing new: the model sees each config once
        *(json.dumps(_history_entry(r), separators=(", ", ": ")) for r in context.history if r.state in FINISHED and r.duplicate_of is None),
    ]
    listing = _unmeasured_feasible(context)
    if listing is not None:
        unmeasured, total = listing
        shown = f"{total}" if len(unmeasured) == total else f"{len(unmeasured)} of {total}, in turn from each kernel class"
        lines += ["", f"Feasible configs not measured yet ({shown}), with their shared memory in bytes:"]
        lines += [f"- {json.dumps(c)} smem {smem}" for c, smem in unmeasured]
    if rejections:
        lines += ["", "Your previous proposals that were rejected (not measured), with the reason:"]
        lines += [f"- {json.dumps(r.proposal.config, default=str)}: {r.reason}" for r in rejections]
    lines += ["", f"Propose {context.k} configs with the {TOOL_NAME} tool."]
    return "\n".join(lines)


@lru_cache(maxsize=64)
def rule_examples(direction: str, problem_class: ProblemClass, target: Target) -> list[tuple[str, str]]:
    """Every feasibility rule that rejects some config of the domain, with the first rejection it gave."""
    space = get_space(direction)
    found: dict[str, str] = {}
    for values in itertools.product(*space.domain.values()):
        verdict = space.check(space.config(dict(zip(space.domain, values))), problem_class, target)
        if not verdict:
            found.setdefault(verdict.rule, verdict.message)
    return list(found.items())


def _history_entry(r: TrialRecord) -> dict:
    entry = {"trial": r.number, "proposer": r.proposer, "config": r.config, "status": r.status}
    if r.confirmation_of is not None:
        entry["confirmation_of"] = r.confirmation_of
    if r.value is not None:
        entry["geomean_tflops"] = round(r.value, 2)
    if r.tflops:
        entry["tflops"] = {k: round(v, 2) for k, v in r.tflops.items() if v is not None}
    if r.reason:
        entry["reason"] = r.reason
    if r.static:
        entry["static"] = r.static
    if r.rationale:
        entry["rationale"] = r.rationale[:MAX_RATIONALE_CHARS]
    return entry


def _unmeasured_feasible(context: Context) -> tuple[list[tuple[dict, int]], int] | None:
    """Up to MAX_LISTED_FEASIBLE of the study's feasible configs not measured yet, taken in turn from each kernel
    class (so a class with many own-knob values does not crowd out the others), and how many there are in all."""
    if context.space.direction != "fwd":
        return None  # the backward product is too large to list
    done = measured(context.history)
    configs = [c for c in context.space.feasible(context.problem_class, context.target) if config_key(c.to_dict()) not in done]
    by_kernel: dict[str, list] = {}
    for c in configs:
        by_kernel.setdefault(c.kernel, []).append(c)
    shown = [c for group in itertools.zip_longest(*by_kernel.values()) for c in group if c is not None][:MAX_LISTED_FEASIBLE]
    return [(c.to_dict(), forward_smem_bytes(c, context.problem_class)[0]) for c in shown], len(configs)

