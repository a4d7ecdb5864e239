"""Every rule of every family, as docs/rules-*.md number them: its family, whether chatgate refuses or warns,
how certain DeepSeek's behaviour is and as of when, and DeepSeek's own wording where it refuses. The
docs and this catalogue agree (tests/rules/test_catalogue.py reads the docs' tables).

    rule("chat", "R27").certainty          # 'documented'
    lookup("A18").level                    # 'refused' (a problem's `rule`, its letter naming the family)
    matching("Invalid max_tokens value, the valid range of max_tokens is [1, 393216]")  # [R27, A2]

`level` is what chatgate does by default: `refused` (a 400), `mixed` (refused in the cases the docs name,
warned in the others), `warned` (forwarded with x-chatgate-warning), `strict` (refused with
`validation.strict` only), `configurable` (off unless a setting turns it on), `legacy` (refused with
`validation.legacy_reasoner_rules`, for the retired deepseek-reasoner), `never` (not checked, never
refused). `says` is the wording DeepSeek was seen or documented to refuse with (a number or a quoted name in
it stands for any); `matching` finds the rules whose wording a DeepSeek error message carries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

FamilyName = Literal["chat", "anthropic", "responses", "fim", "tools"]
Level = Literal["refused", "mixed", "warned", "strict", "configurable", "legacy", "never"]
Certainty = Literal["documented", "observed", "inferred"]
FAMILIES: tuple[FamilyName, ...] = ("chat", "anthropic", "responses", "fim", "tools")
DOCS: dict[FamilyName, str] = {family: f"docs/rules-{family}.md" for family in FAMILIES}
_CERTAINTIES: tuple[Certainty, ...] = ("documented", "observed", "inferred")


@dataclass(frozen=True, slots=True)
class RuleEntry:
    id: str  # "R27"
    family: FamilyName
    level: Level
    note: str  # the certainty as the docs give it: "documented and observed", "inferred (OpenAI's text)"
    as_of: str  # when DeepSeek was last seen to behave so: "2026-11-15", "2026-03", "—" (never seen)
    says: tuple[str, ...] = ()  # DeepSeek's wording when it refuses

    @property
    def certainty(self) -> Certainty:
        """The strongest source the note names first: documented, observed or inferred."""
        found = [(self.note.find(word), word) for word in _CERTAINTIES if word in self.note]
        return min(found)[1] if found else "inferred"

    @property
    def refuses(self) -> bool:
        """Whether chatgate refuses some request by this rule in its default configuration."""
        return self.level in ("refused", "mixed")

    @property
    def doc(self) -> str:
        return DOCS[self.family]


def _r(rule_id: str, family: FamilyName, level: Level, note: str, as_of: str, *says: str) -> RuleEntry:
    return RuleEntry(rule_id, family, level, note, as_of, says)


CATALOGUE: tuple[RuleEntry, ...] = (
    _r('R1', 'chat', 'refused', 'observed', '2026-11-15',
       'Failed to parse the request body as JSON: messages[158].content: unexpected end of hex '
       'escape at line 1 column 350781'),
    _r('R2', 'chat', 'refused', 'documented and observed', '2026-11-15',
       'Failed to deserialize the JSON body into the target type: missing field `model`'),
    _r('R3', 'chat', 'refused', 'observed', '2026-03', 'Model Not Exist'),
    _r('R4', 'chat', 'refused', 'documented', '2026-11-15'),
    _r('R5', 'chat', 'mixed', 'observed (`developer`); documented (`latest_reminder`)', '2026-12-07',
       'messages[1].role: unknown variant `developer`, expected one of `system`, `user`, '
       '`assistant`, `tool`, `latest_reminder`'),
    _r('R6', 'chat', 'refused', 'documented and observed', '2026-09',
       'invalid type: sequence, expected a string'),
    _r('R7', 'chat', 'mixed', 'documented (the three part types)', '2026-12-07'),
    _r('R8', 'chat', 'refused', 'documented', '2026-11-15', 'This model does not support image'),
    _r('R9', 'chat', 'refused', 'documented', '2026-11-15'),
    _r('R10', 'chat', 'refused', "observed; DeepSeek's harness", '2026-08',
       'Invalid assistant message: content or tool_calls must be set'),
    _r('R11', 'chat', 'mixed', 'documented (the shape)', '2026-11-15'),
    _r('R12', 'chat', 'strict', 'inferred', '—'),
    _r('R13', 'chat', 'refused', 'documented and observed', '2026-11-15',
       'messages[3]: missing field `tool_call_id`'),
    _r('R14', 'chat', 'refused', 'observed', '2026-08',
       "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'"),
    _r('R15', 'chat', 'mixed', "inferred (OpenAI's text)", '—',
       "Invalid parameter: 'tool_call_id' of 'X' not found in 'tool_calls' of previous message."),
    _r('R16', 'chat', 'mixed', 'observed', '2026-08',
       "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
       "'tool_call_id'. (insufficient tool messages following tool_calls message)"),
    _r('R17', 'chat', 'mixed', 'documented and observed; contested (spec §13.5)', '2026-11-15',
       'The `reasoning_content` in the thinking mode must be passed back to the API.'),
    _r('R18', 'chat', 'legacy', 'documented (R1 era)', '2025-08'),
    _r('R19', 'chat', 'legacy', 'observed (R1 era)', '2025',
       'deepseek-reasoner does not support successive user or assistant messages (messages[1] and '
       'messages[2] in your input). You should interleave the user/assistant messages in the message'
       ' sequence.'),
    _r('R20', 'chat', 'legacy', 'observed (R1 era)', '2025',
       'The first message (except the system message) of deepseek-reasoner must be a user message, '
       'but an assistant message detected.',
       'The system message of deepseek-reasoner must be put on the beginning of the message sequence',
       'The last message of deepseek-reasoner must be a user message, or an assistant message with '
       'prefix mode on'),
    _r('R21', 'chat', 'refused', 'documented', '2026-11-15'),
    _r('R22', 'chat', 'never', 'documented', '2026-11-15'),
    _r('R23', 'chat', 'refused', 'observed', '2026-07', 'This response_format type is unavailable now'),
    _r('R24', 'chat', 'refused', 'observed', '2026-11-15',
       "Prompt must contain the word 'json' in some form to use 'response_format' of type 'json_object'."),
    _r('R25', 'chat', 'mixed', 'documented', '2026-11-15'),
    _r('R26', 'chat', 'strict', 'documented (deprecated)', '2026-11-15'),
    _r('R27', 'chat', 'refused', 'documented and observed', '2026-11-15',
       'Invalid max_tokens value, the valid range of max_tokens is [1, 8192]'),
    _r('R28', 'chat', 'refused', 'documented', '2026-11-15'),
    _r('R29', 'chat', 'refused', 'documented and observed', '2026-11-15',
       'stream_options should be set along with stream = true'),
    _r('R30', 'chat', 'mixed', 'documented (server tools: 2026-11)', '2026-12-07'),
    _r('R31', 'chat', 'mixed', 'documented and observed', '2026-11-15',
       "Invalid 'tools[0].function.name': string does not match pattern. Expected a string that "
       "matches the pattern '^[a-zA-Z0-9_-]+$'."),
    _r('R32', 'chat', 'mixed', 'documented (/beta); observed (off /beta)', '2026-08'),
    _r('R33', 'chat', 'mixed', 'observed (wording); server-tool choices not documented', '2026-12-07',
       'tool_choice: expected one of `none`, `auto`, `required` or a tool'),
    _r('R34', 'chat', 'refused', 'observed', '2026-08',
       'Thinking mode does not support this tool_choice',
       'deepseek-reasoner does not support this tool_choice'),
    _r('R35', 'chat', 'refused', 'documented', '2026-11-15'),
    _r('R36', 'chat', 'refused', 'documented and observed', '2026-05',
       'unknown variant `auto`, expected one of `adaptive`, `enabled`, `disabled`'),
    _r('R37', 'chat', 'mixed', 'documented (512 bytes, 2026-11)', '2026-12-07'),
    _r('R38', 'chat', 'refused', 'observed', '2025', 'currently, the deepseek api only support n = 1'),
    _r('R39', 'chat', 'never', 'observed', '2026-11-15'),
    _r('R40', 'chat', 'configurable', 'observed', '2026-02',
       "This model's maximum context length is 131072 tokens. However, you requested 131134 tokens "
       '(122942 in the messages, 8192 in the completion)…'),
    _r('R41', 'chat', 'warned', 'observed (April to June 2026), maybe relaxed', '2026-06',
       'thinking options type cannot be disabled when reasoning_effort is set'),
    _r('R42', 'chat', 'refused', 'documented; wording inferred (serde)', '2026-12-07',
       'safety_check.level: unknown variant `medium`, expected `high` or `low`'),
    _r('A1', 'anthropic', 'refused', 'observed (serde)', '2026-11-30',
       'Failed to deserialize the JSON body into the target type: … missing field …'),
    _r('A2', 'anthropic', 'refused', 'documented', '2026-11-30',
       'Invalid max_tokens value, the valid range of max_tokens is [1, 393216]'),
    _r('A3', 'anthropic', 'mixed',
       'observed (`system`, `tool`); documented (`latest_reminder`)',
       '2026-12-07',
       'messages[1].role: unknown variant `system`, expected `user` or `assistant`'),
    _r('A4', 'anthropic', 'warned', 'observed (2025-10); the list has grown', '2026-12-07',
       'unknown variant `image`, expected one of `text`, `tool_use`, `tool_result`, `thinking`'),
    _r('A5', 'anthropic', 'warned', 'documented', '2026-11-30'),
    _r('A6', 'anthropic', 'refused', 'observed', '2026-06',
       'messages.625: all messages must have non-empty content'),
    _r('A7', 'anthropic', 'refused', 'observed', '2026-07',
       'messages.3:`tool_use` ids were found without `tool_result` blocks immediately after: '
       'call_1_…, call_2_…. Each `tool_use` block must have a corresponding `tool_result` block in '
       'the next message.'),
    _r('A8', 'anthropic', 'warned', 'inferred', '—'),
    _r('A9', 'anthropic', 'refused', 'observed', '2026-08-15', 'missing field `thinking`'),
    _r('A10', 'anthropic', 'mixed', 'observed', '2026-08-15',
       'The `content[].thinking` in the thinking mode must be passed back to the API.'),
    _r('A11', 'anthropic', 'refused', 'observed', '2026-04',
       'unknown variant `auto`, expected one of `adaptive`, `enabled`, `disabled`'),
    _r('A12', 'anthropic', 'warned', 'observed (April to June 2026), disputed since', '2026-09',
       'thinking options type cannot be disabled when reasoning_effort is set'),
    _r('A13', 'anthropic', 'mixed', 'observed', '2026-08-03',
       'Thinking mode does not support this tool_choice',
       'deepseek-reasoner does not support this tool_choice'),
    _r('A14', 'anthropic', 'warned', 'documented (the mapping)', '2026-11-30'),
    _r('A15', 'anthropic', 'mixed', 'documented (512 bytes, 2026-11)', '2026-12-07'),
    _r('A16', 'anthropic', 'refused', 'documented', '2026-11-30'),
    _r('A17', 'anthropic', 'warned',
       "documented (DeepSeek's server tools, 2026-11; web_search)",
       '2026-12-07'),
    _r('A18', 'anthropic', 'refused', 'documented', '2026-11-30'),
    _r('A19', 'anthropic', 'warned', 'observed', '2026-04'),
    _r('A20', 'anthropic', 'refused', 'documented', '2026-11-30'),
    _r('A21', 'anthropic', 'refused', 'documented and observed', '2026-09-15'),
    _r('A22', 'anthropic', 'never', 'observed', '2026-02',
       "This model's maximum context length is 131072 tokens. However, you requested 131074 tokens "
       '(99074 in the messages, 32000 in the completion)…'),
    _r('A23', 'anthropic', 'never', 'documented', '2026-11-30'),
    _r('A24', 'anthropic', 'refused', 'documented; wording inferred (serde)', '2026-12-07',
       'unknown variant `x`, expected `high` or `low`'),
    _r('P1', 'responses', 'refused', 'documented', '2026-08-12'),
    _r('P2', 'responses', 'refused', 'observed', '2026-09-10',
       'The supported API model names are deepseek-flash, deepseek-v4-pro, but you passed X.'),
    _r('P3', 'responses', 'warned', 'documented (stateless)', '2026-08-12'),
    _r('P4', 'responses', 'warned', 'documented (the four roles); no refusal of another known', '2026-12-07'),
    _r('P5', 'responses', 'warned', 'documented', '2026-08-12'),
    _r('P6', 'responses', 'mixed', 'documented', '2026-08-12'),
    _r('P7', 'responses', 'mixed', 'documented', '2026-08-12'),
    _r('P8', 'responses', 'refused', 'observed', '2026-09-18', 'missing field `call_id`'),
    _r('P9', 'responses', 'mixed', 'observed', '2026-09-18',
       'No tool call found for tool output with call_id …'),
    _r('P10', 'responses', 'mixed', 'observed', '2026-09-20', 'No tool output found for tool call …'),
    _r('P11', 'responses', 'mixed', 'observed; contested', '2026-08-13',
       'The `reasoning_text` in the thinking mode must be passed back to the API.'),
    _r('P12', 'responses', 'refused', 'documented', '2026-08-12'),
    _r('P13', 'responses', 'mixed', 'documented (server tools: 2026-11)', '2026-12-07'),
    _r('P14', 'responses', 'mixed', 'documented', '2026-08-12'),
    _r('P15', 'responses', 'mixed', 'documented (512 bytes, 2026-11)', '2026-12-07'),
    _r('P16', 'responses', 'refused', 'documented', '2026-08-12'),
    _r('P17', 'responses', 'refused', 'documented', '2026-08-12'),
    _r('P18', 'responses', 'warned', 'documented', '2026-08-12'),
    _r('P19', 'responses', 'warned', 'documented', '2026-08-12'),
    _r('P20', 'responses', 'warned', 'documented', '2026-08-12'),
    _r('P21', 'responses', 'warned', 'documented ("ignored")', '2026-12-07'),
    _r('P22', 'responses', 'warned', 'observed', '2026-09-17'),
    _r('P23', 'responses', 'refused', 'documented; wording inferred (serde)', '2026-12-07',
       'unknown variant `x`, expected `high` or `low`'),
    _r('F1', 'fim', 'refused', 'observed (as R1)', '2026-11-15', 'Failed to parse the request body as JSON'),
    _r('F2', 'fim', 'refused', 'documented', '2026-11-15'),
    _r('F3', 'fim', 'refused', 'observed (as R3)', '2026-03', 'Model Not Exist'),
    _r('F4', 'fim', 'refused', 'documented', '2026-11-15'),
    _r('F5', 'fim', 'refused', 'documented', '2026-11-15'),
    _r('F6', 'fim', 'mixed', 'documented (the guide)', '2026-11-15'),
    _r('F7', 'fim', 'refused', 'documented', '2026-11-15'),
    _r('F8', 'fim', 'refused', 'documented', '2026-11-15'),
    _r('F9', 'fim', 'refused', 'documented', '2026-11-15'),
    _r('F10', 'fim', 'refused', 'documented', '2026-11-15'),
    _r('F11', 'fim', 'refused', 'documented and observed (as R29)', '2026-11-15',
       'stream_options should be set along with stream = true'),
    _r('F12', 'fim', 'strict', 'documented (pricing page)', '2026-11-15'),
    _r('F13', 'fim', 'strict', 'documented (deprecated)', '2026-11-15'),
    _r('F14', 'fim', 'never', 'observed (as R39)', '2026-11-15'),
    _r('T1', 'tools', 'refused', 'documented (the APIs take JSON bodies)', '2026-11-15'),
    _r('T2', 'tools', 'mixed',
       "documented by the Search guide, the range from a third party's live test (docs.apiyi.com, "
       '2026-10-21) [S]',
       '2026-11-15'),
    _r('T3', 'tools', 'mixed', 'documented, as T2', '2026-11-15'),
    _r('T4', 'tools', 'mixed', 'documented (Search guide: "one url ≤ 8,192 characters")', '2026-11-15'),
    _r('T5', 'tools', 'mixed', 'documented for OCR (zh-cn/guides/ocr); ASR inferred', '2026-11-15'),
    _r('T6', 'tools', 'refused', 'documented (zh-cn/guides/ocr)', '2026-11-15'),
    _r('T7', 'tools', 'warned', 'documented values; the refusal unknown', '2026-11-15'),
    _r('T8', 'tools', 'refused', 'documented (16-bit PCM WAV or Ogg Opus ≤ 8 MiB / 120 s)', '2026-11-15'),
)

_BY_ID: dict[tuple[str, str], RuleEntry] = {(entry.family, entry.id): entry for entry in CATALOGUE}


def rule(family: FamilyName, rule_id: str) -> RuleEntry:
    """The rule `rule_id` of `family` (KeyError if it has none of that number)."""
    return _BY_ID[(family, rule_id)]


_PREFIX: dict[str, FamilyName] = {"R": "chat", "A": "anthropic", "P": "responses", "F": "fim", "T": "tools"}


def lookup(rule_id: str) -> RuleEntry | None:
    """The rule a problem's `rule` names ("R27", "A18"): its letter says the family; None for another id."""
    family = _PREFIX.get(rule_id[:1])
    return _BY_ID.get((family, rule_id)) if family is not None else None


def of_family(family: FamilyName) -> tuple[RuleEntry, ...]:
    return tuple(entry for entry in CATALOGUE if entry.family == family)


# What varies in a message: model names, numbers, quoted names, and the placeholders the docs write (X, N, …)
_VARIABLE = re.compile(r"\b(?:deepseek|claude)-[\w.\[\]-]*|\d+|'[^']*'|`[^`]*`|\"[^\"]*\""
                       r"|…|\.\.\.|\bX\b|\bN\b|<[^>]*>")
FRAGMENT_MIN = 6  # shorter literal pieces of a wording are not matched on


def _fragments(wording: str) -> tuple[str, ...]:
    pieces = (piece.strip(" .,:;()[]").lower() for piece in _VARIABLE.split(wording))
    return tuple(piece for piece in pieces if len(piece) >= FRAGMENT_MIN)


_WORDINGS: tuple[tuple[RuleEntry, tuple[str, ...]], ...] = tuple(
    (entry, _fragments(says)) for entry in CATALOGUE for says in entry.says if _fragments(says))


def _carries(message: str, fragments: tuple[str, ...]) -> bool:
    at = 0
    for fragment in fragments:
        at = message.find(fragment, at)
        if at < 0:
            return False
        at += len(fragment)
    return True


def matching(message: str, family: FamilyName | None = None) -> list[RuleEntry]:
    """The rules whose DeepSeek wording `message` carries (its literal parts, in order; numbers and quoted
    names may differ), the closest first (the most of the message explained); [] when none does."""
    text = message.lower()
    scored: dict[tuple[str, str], tuple[int, RuleEntry]] = {}
    for entry, fragments in _WORDINGS:
        if family is not None and entry.family != family:
            continue
        if _carries(text, fragments):
            score = sum(map(len, fragments))
            key = (entry.family, entry.id)
            if score > scored.get(key, (0, entry))[0]:
                scored[key] = (score, entry)
    return [entry for _, entry in sorted(scored.values(), key=lambda found: -found[0])]
