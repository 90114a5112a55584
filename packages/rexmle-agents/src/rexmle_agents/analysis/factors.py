"""The 13 success factors and their rubrics (package data ``assets/rubrics.yaml``), versioned.

A rubric says what counts as demonstrated, what does not, with examples in medical-imaging terms. Its version is
the file's ``version`` plus the first hex digits of the file's SHA-256, so a verdict names exactly the text its
judge read even when an edit forgot to bump the number.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from rexmle_grade.errors import ConfigurationError, UnknownNameError, UserInputError

ASSETS = "rexmle_agents.analysis.assets"
RUBRIC_FILE = "rubrics.yaml"


class Factor(BaseModel):
    """One success factor's rubric."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    name: str
    question: str
    counts: tuple[str, ...]
    does_not_count: tuple[str, ...]
    positive_examples: tuple[str, ...]
    negative_examples: tuple[str, ...]

    def rubric_text(self) -> str:
        """The rubric as the judge reads it (Markdown)."""
        parts = [f"## {self.name} (`{self.id}`)", self.question, "", "Counts as demonstrated:"]
        parts += [f"- {line}" for line in self.counts]
        parts += ["", "Does not count:"] + [f"- {line}" for line in self.does_not_count]
        parts += ["", "Examples that count:"] + [f"- {line}" for line in self.positive_examples]
        parts += ["", "Examples that do not count:"] + [f"- {line}" for line in self.negative_examples]
        return "\n".join(parts)


class Rubrics(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str
    factors: tuple[Factor, ...]
    digest: str = ""  # sha256 of the file, filled on load

    @property
    def label(self) -> str:
        """What a verdict records: ``<version>-<8 hex digits of the file's sha256>``."""
        return f"{self.version}-{self.digest[:8]}"

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(f.id for f in self.factors)

    def get(self, factor_id: str) -> Factor:
        for factor in self.factors:
            if factor.id == factor_id:
                return factor
        raise UnknownNameError("factor", factor_id, self.ids)

    def select(self, spec: str | Sequence[str] | None) -> tuple[Factor, ...]:
        """``all`` (or None), or a comma-separated list / sequence of factor ids, in rubric order."""
        if spec is None or spec == "all":
            return self.factors
        wanted = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
        if not wanted:
            raise UserInputError("no factor named",
                                 hint="--factors all, or ids such as data_augmentation,post_processing")
        chosen = {self.get(name).id for name in wanted}
        return tuple(f for f in self.factors if f.id in chosen)


@functools.cache
def load_rubrics() -> Rubrics:
    """The shipped rubrics (checked: 13 factors, unique ids)."""
    raw = resources.files(ASSETS).joinpath(RUBRIC_FILE).read_bytes()
    try:
        rubrics = Rubrics.model_validate(yaml.safe_load(raw))
    except (ValidationError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"the shipped {RUBRIC_FILE} is not a valid rubric file: {exc}",
                                 hint="reinstall rexmle-agents, or fix the file if you edited it") from None
    ids = rubrics.ids
    if len(set(ids)) != len(ids):
        raise ConfigurationError(f"{RUBRIC_FILE} names a factor twice: {sorted(ids)}")
    return rubrics.model_copy(update={"digest": hashlib.sha256(raw).hexdigest()})


FACTOR_IDS: tuple[str, ...] = (
    "failure_analysis", "state_of_the_art", "metric_aware_design", "domain_knowledge", "fast_iteration",
    "data_augmentation", "expert_priors", "data_curation", "post_processing", "heterogeneous_ensembles",
    "external_data", "seed_fold_ensembles", "hyperparameter_search",
)
