"""Tables nobody tuned for: the unseen tables of ``benchmarks/number_tables.py --unseen``.

Six tables of the ``vega-datasets`` package that no training setting of this project was chosen on, each read as a
user would write a config for it: a template whose *last* number is the target, and a split. Four are split in
time (the held-out rows come after every training row, as a forecaster would split), two at random.

    stocks            price of a share from its symbol and the month (text and a date); held out from 2009
    seattle-temps     an hourly temperature reading from its timestamp (every 6th hour of 2010); held out Nov-Dec
    iowa-electricity  Iowa's yearly net generation from the source (text) and the year (a date); held out from 2013
    us-employment     the month's nonfarm payroll from three sector counts; held out from 2014
    airports          an airport's latitude from its name, city and state (text only); a seeded 25% held out
    la-riots          a victim's age from gender, race, kind of death and neighbourhood (text only); a seeded 30%

Each `UnseenTable` names, besides the template: the column that gives each row's time (``time``, ISO text, the
config's ``split_by`` and the last-value baseline's order), the category column of the per-group baselines
(``group``), and the columns the least-squares and gradient-boosting baselines read (``baseline_columns``: a
template field read from another column, e.g. a year as a number where the sentence writes the date).
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

HELD_OUT = 1  # value of the row's "fold": 1 held out, 0 training


@dataclass
class UnseenTable:
    """One table: rows (each with a ``fold``), the sentence template (target last), the target column, how it is
    split, the time column (None for a random split), the group column (None when the template has no category)
    and the baselines' columns."""

    name: str
    rows: list[dict[str, Any]]
    template: str
    target: str
    split: str
    time: str | None = None
    split_at: str | None = None
    group: str | None = None
    baseline_columns: dict[str, str] = field(default_factory=dict)

    @property
    def predictors(self) -> list[str]:
        """The baselines' columns: the template's fields other than the target (or their `baseline_columns`)."""
        from causal_qwen.training.data import template_fields

        return [self.baseline_columns.get(name, name) for name in template_fields(self.template) if name != self.target]

    def train_rows(self) -> list[dict]:
        return [row for row in self.rows if row["fold"] != HELD_OUT]

    def held_out_rows(self) -> list[dict]:
        return [row for row in self.rows if row["fold"] == HELD_OUT]


def _vega_path(name: str):
    from causal_qwen.training.data import vega_dataset_path

    return vega_dataset_path(name)


def _csv(name: str) -> list[dict[str, str]]:
    with _vega_path(name).open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _time_split(rows: list[dict], time: str, split_at: str) -> list[dict]:
    for row in rows:
        row["fold"] = int(row[time] >= split_at)
    return rows


def _seeded_split(rows: list[dict], fraction: float, seed: int = 0) -> list[dict]:
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[: round(fraction * len(rows))])
    for index, row in enumerate(rows):
        row["fold"] = int(index in held)
    return rows


def stocks() -> UnseenTable:
    rows = []
    for row in _csv("stocks.csv"):
        moment = datetime.strptime(row["date"], "%b %d %Y")
        rows.append({**row, "time": moment.strftime("%Y-%m-%d"), "year": str(moment.year + (moment.month - 1) / 12)})
    return UnseenTable("stocks", _time_split(rows, "time", "2009-01-01"), "{symbol} on {date}: {price} dollars.",
                       "price", "train 2000-2008, held out 2009-2010", time="time", split_at="2009-01-01",
                       group="symbol", baseline_columns={"date": "year"})


def _every_sixth_hour(name: str, date_format: str) -> list[dict]:
    """An hourly table's rows at 0, 6, 12 and 18 h, with the moment as ``time`` (ISO), ``day`` and ``when``."""
    rows = []
    for row in _csv(name):
        moment = datetime.strptime(row["date"], date_format)
        if moment.hour % 6 == 0:
            rows.append({**row, "time": moment.strftime("%Y-%m-%d %H:%M"), "day": moment.strftime("%Y/%m/%d"),
                         "hour": str(moment.hour), "when": moment.strftime("%Y/%m/%d %H:%M")})
    return rows


def seattle_temps() -> UnseenTable:
    rows = _every_sixth_hour("seattle-temps.csv", "%Y/%m/%d %H:%M")
    return UnseenTable("seattle-temps", _time_split(rows, "time", "2010-11-01"), "At {date} it was {temp} F.",
                       "temp", "every 6th hour of 2010; train Jan-Oct, held out Nov-Dec", time="time",
                       split_at="2010-11-01", baseline_columns={"date": "day"})


def iowa_electricity() -> UnseenTable:
    rows = [{**row, "time": row["year"], "year_number": row["year"][:4]} for row in _csv("iowa-electricity.csv")]
    return UnseenTable("iowa-electricity", _time_split(rows, "time", "2013-01-01"),
                       "{source} in {year}: {net_generation} GWh.", "net_generation",
                       "train 2001-2012, held out 2013-2017", time="time", split_at="2013-01-01", group="source",
                       baseline_columns={"year": "year_number"})


def us_employment() -> UnseenTable:
    rows = [{**row, "time": row["month"]} for row in _csv("us-employment.csv")]
    return UnseenTable("us-employment", _time_split(rows, "time", "2014-01-01"),
                       "{month}: construction {construction}, manufacturing {manufacturing}, government {government}, "
                       "nonfarm {nonfarm} thousand.", "nonfarm", "train 2006-2013, held out 2014-2015",
                       time="time", split_at="2014-01-01")


def airports() -> UnseenTable:
    rows = [row for row in _csv("airports.csv") if row["country"] == "USA" and row["state"]]
    return UnseenTable("airports", _seeded_split(rows, 0.25), "{name} airport in {city}, {state}: latitude {latitude}.",
                       "latitude", "a seeded 25% held out", group="state")


def la_riots() -> UnseenTable:
    rows = [row for row in _csv("la-riots.csv") if row["age"]]
    return UnseenTable("la-riots", _seeded_split(rows, 0.3),
                       "{gender}, {race}, {type}, {neighborhood}: aged {age}.", "age", "a seeded 30% held out",
                       group="type")


UNSEEN_TABLES: dict[str, Callable[[], UnseenTable]] = {
    "stocks": stocks, "seattle-temps": seattle_temps, "iowa-electricity": iowa_electricity,
    "us-employment": us_employment, "airports": airports, "la-riots": la_riots,
}
"""Issue 31's six tables (``--unseen``)."""


# ---- the second set: defined before any run of the recipe on them, and never used to choose a setting ----------
def _json(name: str) -> list[dict[str, str]]:
    """A vega JSON table as text cells, as a CSV export would hold them."""
    with _vega_path(name).open(encoding="utf-8") as handle:
        return [{key: str(value) for key, value in row.items()} for row in json.load(handle)]


def iris() -> UnseenTable:
    return UnseenTable("iris", _seeded_split(_json("iris.json"), 0.3),
                       "A {species} iris, sepal {sepalLength} by {sepalWidth} cm, petal {petalLength} cm long and "
                       "{petalWidth} cm wide.", "petalWidth", "a seeded 30% held out", group="species")


def sf_temps() -> UnseenTable:
    rows = _every_sixth_hour("sf-temps.csv", "%Y/%m/%d %H:%M:%S")
    return UnseenTable("sf-temps", _time_split(rows, "time", "2010-10-01"), "San Francisco, {when}: {temp} F.",
                       "temp", "every 6th hour of 2010; train Jan-Sep, held out Oct-Dec", time="time",
                       split_at="2010-10-01", baseline_columns={"when": "day"})


def wheat() -> UnseenTable:
    rows = [{**row, "time": row["year"]} for row in _json("wheat.json") if "wages" in row]
    return UnseenTable("wheat", _time_split(rows, "time", "1750"),
                       "{year}: wages {wages} shillings a week, wheat {wheat} shillings a quarter.", "wheat",
                       "every 5th year 1565-1810; train to 1745, held out from 1750", time="time", split_at="1750")


def driving() -> UnseenTable:
    rows = [{**row, "time": row["year"]} for row in _json("driving.json")]
    return UnseenTable("driving", _time_split(rows, "time", "2000"),
                       "{year}: {miles} miles driven per person, gas at {gas} dollars a gallon.", "gas",
                       "yearly 1956-2010; train to 1999, held out from 2000", time="time", split_at="2000")


def ohlc() -> UnseenTable:
    rows = [{**row, "time": row["date"]} for row in _json("ohlc.json")]
    return UnseenTable("ohlc", _time_split(rows, "time", "2009-07-01"),
                       "{date}: opened at {open}, high {high}, low {low}, closed at {close}.", "close",
                       "trading days of June-July 2009; train June, held out July", time="time",
                       split_at="2009-07-01")


SECOND_SET: dict[str, Callable[[], UnseenTable]] = {
    "iris": iris, "sf-temps": sf_temps, "wheat": wheat, "driving": driving, "ohlc": ohlc,
}
"""Five more tables (``--unseen second``), written after issue 31's six had shaped the recipe, to see whether it
holds on tables it has never met: a random split with a category, and four time splits (a reading from its
timestamp, two yearly series with a predictor, daily prices)."""

ALL_TABLES: dict[str, Callable[[], UnseenTable]] = {**UNSEEN_TABLES, **SECOND_SET}
REAL_WEIGHT_TABLES = tuple(ALL_TABLES)
"""The unseen tables the real weights train on (``--real-base``): all of them (with the features cached, the frozen
base reads each row once, and issue 31's six fit in well under an hour on 2 CPU cores)."""


def to_json(rows: list[dict]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def main() -> int:
    """Print each unseen table: its rows, split, template, time and group columns (no training)."""
    for name, build in ALL_TABLES.items():
        table = build()
        print(f"{name}: {len(table.train_rows())} training / {len(table.held_out_rows())} held-out rows ({table.split})")
        print(f"    template {table.template!r}, target {table.target}, time {table.time}, group {table.group}"
              + (" (real weights too)" if name in REAL_WEIGHT_TABLES else ""))
    return 0


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for causal_qwen
    raise SystemExit(main())
