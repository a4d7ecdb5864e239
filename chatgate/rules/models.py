"""The models DeepSeek serves, and the one refusal of a model it does not (R3, A18, P2, F3): the model's
profile when chatgate has one, and otherwise a 400 `model_not_found` naming the closest served model (or a
warning, for a deployment in front of a newer DeepSeek: `validation.unknown_models = "warn"`). A model
DeepSeek added after these rules were dated is forwarded when configured (`validation.extra_models`, or a
`[models."<name>"]` profile): no code change."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from chatgate.errors import Problem
from chatgate.profiles import DEFAULT_PROFILES, ModelProfile, generic_profile
from chatgate.rules.catalogue import FamilyName, rule
from chatgate.rules.kernel import CheckOptions

GENERAL_MODEL = "deepseek-flash"  # suggested when no served name is close


def _default_profiles() -> dict[str, ModelProfile]:
    return dict(DEFAULT_PROFILES)


@dataclass(frozen=True, slots=True)
class Policy:
    """What every family's rules are run with: the model profiles, the names DeepSeek serves without one
    (`extra_models`), and the validation options."""

    profiles: Mapping[str, ModelProfile] = field(default_factory=_default_profiles)
    options: CheckOptions = field(default_factory=CheckOptions)
    extra_models: frozenset[str] = frozenset()

    def profile_for(self, model: str) -> tuple[ModelProfile, bool]:
        """The model's profile and whether chatgate has one (else the general rules' profile)."""
        profile = self.profiles.get(model)
        return (profile, True) if profile is not None else (generic_profile(model), False)

    def served(self, model: str) -> bool:
        """Whether DeepSeek serves `model` as far as chatgate knows (a profile, or an extra model)."""
        return model in self.profiles or model in self.extra_models

    def suggestions(self) -> list[str]:
        """The served names a client should use (the retired deepseek-chat / deepseek-reasoner left out)."""
        names = [name for name, profile in self.profiles.items()
                 if not (profile.thinking_only or profile.non_thinking_only)]
        return [*names, *sorted(self.extra_models - set(names))]


def closest(model: str, names: Collection[str]) -> str:
    """The served name `model` most likely means (a typo, another case, a version), else the general one."""
    lowered = {name.lower(): name for name in names}
    if model.lower() in lowered:
        return lowered[model.lower()]
    found = difflib.get_close_matches(model.lower(), list(lowered), n=1, cutoff=0.6)
    if found:
        return lowered[found[0]]
    return GENERAL_MODEL if GENERAL_MODEL in names or not names else next(iter(names))


def unknown_model(model: str, family: FamilyName, rule_id: str, served: Collection[str],
                  options: CheckOptions, deepseek_says: str | None = None, doubt: bool = False) -> Problem:
    """The problem of a model DeepSeek does not serve: refused (or warned, as configured, or when `doubt`
    says DeepSeek may still serve it), naming the closest served model, the served ones, DeepSeek's own
    answer when known, and the rule's certainty and date."""
    entry = rule(family, rule_id)
    said = f" (DeepSeek answers it: \"{deepseek_says}\")" if deepseek_says else ""
    best = closest(model, served)
    other_case = best.lower() == model.lower()
    warning = other_case or doubt or not options.refuse_unknown_models
    if other_case:
        head = (f"Model '{model}' is not spelt as DeepSeek names its models: did you mean '{best}'? "
                "Forwarded as sent.")
    else:
        head = (f"Model '{model}' is not a model DeepSeek serves{said}: did you mean '{best}'? DeepSeek "
                f"serves {', '.join(served)}.")
        if warning:
            head += " Forwarded as sent (validation.unknown_models = \"warn\")."
    return Problem("model_not_found", "model",
                   f"{head} (Rule {rule_id}, {entry.certainty} as of {entry.as_of}; a model DeepSeek added "
                   "since: add it to validation.extra_models.)", rule_id, warning=warning)
