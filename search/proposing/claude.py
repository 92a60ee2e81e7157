"""Claude as a proposer: the anthropic SDK's Messages API with a tool whose schema is the knob domain.

The key comes from ANTHROPIC_API_KEY and the endpoint from ANTHROPIC_BASE_URL (tests point it at a
local server). Rate limits, overload, timeouts and refused connections are retried with exponential
backoff; then the turn passes to the sampler. Rejected proposals go back to the model on its next turn.
Without the SDK (SDK_MISSING says why) the module still imports and the proposer passes every turn to the
sampler, as without a key: a GPU machine need not carry the SDK to run a search.
"""

from __future__ import annotations

import json
import os
import time

from search import optional
from search.proposing import prompt
from search.proposing.prompt import DEFAULT_MODEL
from search.proposing.proposer import Context, Proposal, Proposer, ProposerUnavailable, Rejection

SDK_MISSING = optional.why_missing("anthropic")  # None when the SDK imports
if SDK_MISSING is None:
    import anthropic

    # Worth retrying: the request may succeed a moment later.
    RETRYABLE = (anthropic.RateLimitError, anthropic.InternalServerError, anthropic.APITimeoutError, anthropic.APIConnectionError)
    # Not worth another turn in this run: the key itself is refused.
    PERMANENT = (anthropic.AuthenticationError, anthropic.PermissionDeniedError)


def sdk_missing_line() -> str | None:
    """The line a run prints when it goes on without the SDK; None when the SDK imports."""
    if SDK_MISSING is None:
        return None
    return optional.skipped("the claude proposer", SDK_MISSING) + ": the sampler takes every turn"


class ClaudeProposer(Proposer):
    """Proposes k configs per turn, each with a one-paragraph rationale, through tool use."""

    name = "claude"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout_s: float = 60.0,
        retries: int = 3,
        backoff_s: float = 2.0,
        max_tokens: int = 4096,
    ):
        self.model = model
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_tokens = max_tokens
        self.pending: list[Rejection] = []  # shown to the model on its next turn
        self.calls = 0  # API requests made (retries included)
        key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY", "")
        self.client = None
        if key and SDK_MISSING is None:
            # max_retries=0: our own retry loop, so the backoff is ours to set (and short in tests).
            self.client = anthropic.Anthropic(
                api_key=key, base_url=base_url or os.environ.get("ANTHROPIC_BASE_URL") or None,
                max_retries=0, timeout=timeout_s,
            )

    def propose(self, context: Context) -> list[Proposal]:
        """One request (retried on transient errors); raises ProposerUnavailable to pass the turn."""
        if SDK_MISSING is not None:
            raise ProposerUnavailable(f"the anthropic SDK does not import ({SDK_MISSING}): the sampler takes claude's turns", permanent=True)
        if self.client is None:
            raise ProposerUnavailable("no ANTHROPIC_API_KEY set: the sampler takes claude's turns", permanent=True)
        rejections, self.pending = self.pending, []
        request = dict(
            model=self.model,
            max_tokens=self.max_tokens,
            system=prompt.system_prompt(context),
            messages=[{"role": "user", "content": prompt.user_message(context, rejections)}],
            tools=[prompt.tool(context)],
            tool_choice={"type": "tool", "name": prompt.TOOL_NAME},
        )
        message = self._create(request, rejections)
        proposals, malformed = parse_reply(message)
        self.pending.extend(malformed)
        return proposals

    def feedback(self, rejections: list[Rejection]) -> None:
        self.pending.extend(rejections)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def _create(self, request: dict, rejections: list[Rejection]):
        last = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            self.calls += 1
            try:
                return self.client.messages.create(**request)
            except PERMANENT as err:
                raise ProposerUnavailable(f"API refused the key ({_describe(err)}): the sampler takes claude's turns", permanent=True)
            except RETRYABLE as err:
                last = err
            except anthropic.AnthropicError as err:
                self.pending = rejections + self.pending  # not seen by the model: show them next time
                raise ProposerUnavailable(f"API error ({_describe(err)}): turn passes to the sampler")
        self.pending = rejections + self.pending
        raise ProposerUnavailable(f"API unavailable after {self.retries + 1} attempts ({_describe(last)}): turn passes to the sampler")


def parse_reply(message) -> tuple[list[Proposal], list[Rejection]]:
    """Proposals from the tool call of a reply, and rejections for whatever is malformed."""
    calls = [b for b in message.content if getattr(b, "type", "") == "tool_use" and b.name == prompt.TOOL_NAME]
    if not calls:
        text = " ".join(getattr(b, "text", "") for b in message.content).strip()
        return [], [Rejection(Proposal(None), f"the reply had no {prompt.TOOL_NAME} tool call (text: {text[:200]!r})")]
    proposals, rejections = [], []
    for call in calls:
        items = call.input.get("proposals") if isinstance(call.input, dict) else None
        if isinstance(items, str):  # a model sometimes sends the array as a JSON string
            try:
                items = json.loads(items)
            except json.JSONDecodeError as err:
                rejections.append(Rejection(Proposal(items[:200]), f"'proposals' is not valid JSON ({err})"))
                continue
        if not isinstance(items, list):
            rejections.append(Rejection(Proposal(call.input), "tool input must be {\"proposals\": [{\"config\": {...}, \"rationale\": \"...\"}]}"))
            continue
        for item in items:
            if not isinstance(item, dict) or "config" not in item:
                rejections.append(Rejection(Proposal(item), "each proposal must be an object with 'config' and 'rationale'"))
            else:
                proposals.append(Proposal(item["config"], item.get("rationale", "")))
    return proposals, rejections


def _describe(err: Exception | None) -> str:
    status = getattr(err, "status_code", None)
    name = type(err).__name__
    return f"{name} {status}" if status else name
