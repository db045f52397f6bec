"""Problems found in the input: reported with file (and line), counted by reason, kept in the manifest."""
from __future__ import annotations

import collections
import dataclasses
import sys
from typing import Any

MAX_ITEMS = 1000  # items listed in the manifest; counts are always complete
MAX_ECHO = 20     # items printed as they happen; the rest are only counted and listed in the manifest


@dataclasses.dataclass
class Report:
    """Collects skipped items (dropped input) and warnings (kept input, e.g. repaired UTF-8).
    `echo` prints each as it happens (to stderr)."""

    echo: bool = True
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    items: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    warning_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    warnings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    echoed: int = 0

    def _echo(self, message: str) -> None:
        if self.echo and self.echoed < MAX_ECHO:
            print(f"rgpt-prep: {message}", file=sys.stderr)
        elif self.echo and self.echoed == MAX_ECHO:
            print(f"rgpt-prep: further problems are not printed; manifest.json counts and lists them",
                  file=sys.stderr)
        self.echoed += 1

    def warn(self, reason: str, file: str, line: int | None = None) -> None:
        self.warning_counts[reason] += 1
        item = {"file": file, "reason": reason, **({"line": line} if line is not None else {})}
        if len(self.warnings) < MAX_ITEMS:
            self.warnings.append(item)
        self._echo(f"warning {file}:{line}: {reason}" if line is not None else f"warning {file}: {reason}")

    def skip(self, reason: str, file: str, line: int | None = None, detail: str = "") -> None:
        self.counts[reason] += 1
        item = {"file": file, "reason": reason}
        if line is not None:
            item["line"] = line
        if detail:
            item["detail"] = detail
        if len(self.items) < MAX_ITEMS:
            self.items.append(item)
        where = f"{file}:{line}" if line is not None else file
        self._echo(f"skipped {where}: {reason}{' (' + detail + ')' if detail else ''}")

    def merge(self, other: dict[str, Any]) -> None:
        """Fold in a report saved by a completed part (resumed runs)."""
        self.counts.update(other["skipped"]["counts"])
        self.items.extend(other["skipped"]["items"][: max(0, MAX_ITEMS - len(self.items))])
        self.warning_counts.update(other["warnings"]["counts"])
        self.warnings.extend(other["warnings"]["items"][: max(0, MAX_ITEMS - len(self.warnings))])

    def to_dict(self) -> dict[str, Any]:
        return {"skipped": {"counts": dict(sorted(self.counts.items())), "items": self.items,
                            "items_truncated": sum(self.counts.values()) > len(self.items)},
                "warnings": {"counts": dict(sorted(self.warning_counts.items())), "items": self.warnings,
                             "items_truncated": sum(self.warning_counts.values()) > len(self.warnings)}}
