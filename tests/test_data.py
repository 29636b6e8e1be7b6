"""Training data: JSONL / text / CSV readers, templates, splits, collator, config loading and its errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
import torch

from causal_qwen.training.collator import NumericCollator, tokenize_documents
from causal_qwen.training.data import (
    DataSource,
    Document,
    SplitSpec,
    read_documents,
    resolve_data_path,
    split_documents,
    template_fields,
)
from causal_qwen.training.train_config import load_train_config, parse_override

WEATHER_TEMPLATE = "On {date} Seattle saw {precipitation} mm of rain and a low of {temp_min} C; the high was {temp_max} C."


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---- readers ---------------------------------------------------------------------------------------------
def test_jsonl_reads_text_field(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"text": "It costs 9.5 dollars."}\n\n{"text": "Two", "other": 1}\n')
    docs = read_documents(DataSource(path=path))
    assert [d.text for d in docs] == ["It costs 9.5 dollars.", "Two"]
    assert [d.row for d in docs] == [1, 3]


def test_jsonl_row_without_text_names_file_and_line(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"text": "ok"}\n{"body": "no text here"}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl: line 2: no 'text' field \(fields: body\)"):
        read_documents(DataSource(path=path))
    assert len(read_documents(DataSource(path=path, skip_bad_rows=True))) == 1


def test_jsonl_invalid_json_names_line(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"text": "ok"}\n{"text": \n')
    with pytest.raises(ValueError, match=r"d\.jsonl: line 2 is not valid JSON"):
        read_documents(DataSource(path=path))


def test_plain_text_lines_and_blocks(tmp_path):
    path = write(tmp_path / "d.txt", "first line\nsecond 2\n\n\nthird\n  \nfourth\nfifth\n")
    lines = read_documents(DataSource(path=path))
    assert [d.text for d in lines] == ["first line", "second 2", "third", "fourth", "fifth"]
    blocks = read_documents(DataSource(path=path, text_unit="block"))
    assert [d.text for d in blocks] == ["first line\nsecond 2", "third", "fourth\nfifth"]
    assert [d.row for d in blocks] == [1, 5, 7]


def test_csv_template_fills_named_fields_and_keeps_spelling(tmp_path):
    path = write(tmp_path / "w.csv", "date,precipitation,temp_max,temp_min\n2012/01/01,0.0,12.8,5.0\n2012/01/02,10.9,10.6,2.8\n")
    docs = read_documents(DataSource(path=path, template=WEATHER_TEMPLATE, split_by="date"))
    assert docs[0].text == "On 2012/01/01 Seattle saw 0.0 mm of rain and a low of 5.0 C; the high was 12.8 C."
    assert docs[1].split_value == "2012/01/02" and docs[1].row == 2


def test_template_format_spec_formats_numbers(tmp_path):
    path = write(tmp_path / "t.csv", "x\n1.25\n")
    docs = read_documents(DataSource(path=path, template="value {x:.1f}"))
    assert docs[0].text == "value 1.2"


def test_csv_missing_template_field_suggests_column(tmp_path):
    path = write(tmp_path / "w.csv", "date,precipitation,temp_max,temp_min\n2012/01/01,0.0,12.8,5.0\n")
    with pytest.raises(ValueError, match=r"w\.csv: row 0 \(header\): template field 'temp_mx' is not a column.*did you mean 'temp_max'"):
        read_documents(DataSource(path=path, template="high {temp_mx}"))
    crimea = write(tmp_path / "c.csv", "date,wounds,other,disease\n1854-04-01,0,110,110\n")
    with pytest.raises(ValueError, match=r"template field 'month' is not a column") as raised:  # 'other' is no match
        read_documents(DataSource(path=crimea, template="In {month}: {disease} to disease."))
    assert "did you mean" not in str(raised.value)


def test_non_numeric_value_in_numeric_field_names_file_and_row(tmp_path):
    rows = "date,temp_max\n2012/01/01,12.8\n2012/01/02,warm\n2012/01/03,11.0\n"
    path = write(tmp_path / "w.csv", rows)
    # inferred: temp_max is mostly numbers, so it is a numeric field
    with pytest.raises(ValueError, match=r"w\.csv: row 2 \(line 3\): template field 'temp_max' holds 'warm', which is not a number"):
        read_documents(DataSource(path=path, template="{date}: {temp_max} C"))
    docs = read_documents(DataSource(path=path, template="{date}: {temp_max} C", skip_bad_rows=True))
    assert [d.row for d in docs] == [1, 3]
    # declared numeric fields are checked even when the column is mostly text
    with pytest.raises(ValueError, match="row 1 .*'date' holds '2012/01/01'"):
        read_documents(DataSource(path=path, template="{date}", numeric_fields=["date"]))


def test_empty_dataset_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"e\.jsonl: the dataset is empty"):
        read_documents(DataSource(path=write(tmp_path / "e.jsonl", "\n\n")))
    with pytest.raises(ValueError, match=r"e\.csv: the dataset is empty"):
        read_documents(DataSource(path=write(tmp_path / "e.csv", "a,b\n"), template="{a}"))
    with pytest.raises(ValueError, match="the dataset is empty"):
        read_documents(DataSource(path=write(tmp_path / "e.txt", "")))


def test_template_errors():
    assert template_fields("{a} and {b:.1f} and {a}") == ["a", "b"]
    with pytest.raises(ValueError, match="positional"):
        template_fields("{} x")
    with pytest.raises(ValueError, match="no named field"):
        template_fields("plain")


def test_vega_dataset_resolves():
    path = resolve_data_path("vega:seattle-weather.csv")
    assert path.name == "seattle-weather.csv" and path.is_file()
    assert resolve_data_path("vega:seattle-weather") == path
    with pytest.raises(ValueError, match="ships no file"):
        resolve_data_path("vega:nope.csv")
    with pytest.raises(FileNotFoundError):
        resolve_data_path("/no/such/file.jsonl")


# ---- splits ----------------------------------------------------------------------------------------------
def docs_with_dates(dates):
    return [Document(text=f"d {d}", source="x", row=i + 1, split_value=d) for i, d in enumerate(dates)]


def test_split_by_column_at_value():
    docs = docs_with_dates(["2014/12/30", "2015/01/02", "2014/06/01", "2015/01/01"])
    train, valid = split_documents(docs, SplitSpec(split_by="date", split_at="2015/01/01"))
    assert [d.split_value for d in train] == ["2014/12/30", "2014/06/01"]
    assert [d.split_value for d in valid] == ["2015/01/02", "2015/01/01"]


def test_split_by_column_fraction_keeps_latest_values():
    docs = docs_with_dates([f"2015/01/{day:02d}" for day in range(1, 11)])
    train, valid = split_documents(docs, SplitSpec(fraction=0.2, split_by="date"))
    assert max(d.split_value for d in train) < min(d.split_value for d in valid)
    assert len(valid) == 2


def test_split_by_numeric_column_compares_numbers():
    docs = docs_with_dates(["9", "10", "100"])
    train, valid = split_documents(docs, SplitSpec(split_by="year", split_at=10))
    assert [d.split_value for d in train] == ["9"] and len(valid) == 2


def test_random_split_is_seeded_and_disjoint():
    docs = docs_with_dates(list(range(20)))
    a = split_documents(docs, SplitSpec(fraction=0.25, seed=1))
    b = split_documents(docs, SplitSpec(fraction=0.25, seed=1))
    assert a == b and len(a[1]) == 5 and not set(map(id, a[0])) & set(map(id, a[1]))


def test_split_by_two_digit_year_dates_and_a_bad_date_named_with_the_files_values():
    docs = docs_with_dates(["17-Sep-03", "18-Sep-03", "22-Sep-03", "2-Jan-04"])
    train, valid = split_documents(docs, SplitSpec(split_by="Date", split_at="2003-09-20"))
    assert [d.split_value for d in train] == ["17-Sep-03", "18-Sep-03"] and len(valid) == 2
    bad = docs_with_dates(["17-Sep-03", "18-Sep-03", "Sep 19th"])
    with pytest.raises(ValueError, match=r"x: row 3: split_by column 'Date' holds 'Sep 19th', which is not a number "
                                         r"and not a date written like the rows before it \('17-Sep-03', read as "
                                         r"%d-%b-%y\); write every date of the column the same way \(dates "
                                         r"written like 2015-01-31, .*31-Jan-15"):
        split_documents(bad, SplitSpec(split_by="Date", split_at="2003-09-20"))
    # the spelling named is the one that reads the first value, not one that read it only as ISO 8601
    mixed = docs_with_dates(["2023-01-01", "01/02/2023", "03-Jan-23"])
    with pytest.raises(ValueError, match=r"row 3: .* holds '03-Jan-23', .*\('2023-01-01', read as %Y-%m-%d\)"):
        split_documents(mixed, SplitSpec(split_by="Date", split_at="2023-01-02"))


def test_month_and_year_dates_split_and_a_date_cut_on_a_number_column_is_named():
    months = docs_with_dates(["11/2022", "12/2022", "01/2023", "02/2023"])
    train, valid = split_documents(months, SplitSpec(split_by="Date", split_at="01/2023"))
    assert [d.split_value for d in train] == ["11/2022", "12/2022"] and len(valid) == 2
    dashed = docs_with_dates(["12-2022", "01-2023"])
    train, valid = split_documents(dashed, SplitSpec(split_by="Date", split_at="2023-01-01"))
    assert [d.split_value for d in train] == ["12-2022"] and len(valid) == 1
    years = docs_with_dates(["2021", "2022", "2023"])
    with pytest.raises(ValueError, match=r"split_at '2023-01-01' is a date, but split_by column 'Date' holds "
                                         r"numbers \(such as '2021'\); give split_at as a number"):
        split_documents(years, SplitSpec(split_by="Date", split_at="2023-01-01"))


def test_a_number_column_with_text_in_it_names_the_text(caplog):
    with pytest.raises(ValueError, match=r"x: row 3: split_by column 'year' holds 'n/a', which is not a number like "
                                         r"the rows before it \('1990'\)"):
        split_documents(docs_with_dates(["1990", "1991", "n/a", "1993"]), SplitSpec(split_by="year", split_at=1991))


def test_two_digit_years_across_the_century_warn(caplog):
    with caplog.at_level("WARNING", logger="causal_qwen.training.data"):
        train, valid = split_documents(docs_with_dates(["1-Jan-98", "1-Jan-99", "1-Jan-00", "1-Jan-01"]),
                                       SplitSpec(split_by="Date", split_at="2000-01-01"))
    assert len(train) == len(valid) == 2
    assert "two-digit years read as 1969-1999" in caplog.text and "years 1998 to 2001" in caplog.text


def test_split_that_leaves_nothing_is_an_error():
    docs = docs_with_dates(["2014/01/01"])
    with pytest.raises(ValueError, match="leaves no validation rows"):
        split_documents(docs, SplitSpec(split_by="date", split_at="2015/01/01"))


# ---- tokenizing and collating ----------------------------------------------------------------------------
class ToyTokenizer:
    """Words → ids 10.., numbers → <NUM> (id 5) with their value; eos 2."""

    eos_token_id = 2
    num_token_id = 5

    def __call__(self, texts, padding=False, return_tensors=None):
        assert padding is False and return_tensors is None
        ids, values = [], []
        for text in texts:
            row_ids, row_values = [], []
            for word in text.split():
                try:
                    row_values.append(float(word))
                    row_ids.append(self.num_token_id)
                except ValueError:
                    row_ids.append(10 + len(word))
                    row_values.append(0.0)
            ids.append(row_ids)
            values.append(row_values)
        return {"input_ids": ids, "numeric_values": values}


def test_tokenize_documents_appends_eos_and_truncates():
    docs = [Document("a 1.5 bb", "x", 1), Document("one two three four five six", "x", 2)]
    dataset = tokenize_documents(docs, ToyTokenizer(), max_length=4)
    assert dataset[0] == {"input_ids": [11, 5, 12, 2], "numeric_values": [0.0, 1.5, 0.0, 0.0]}
    assert len(dataset[1]["input_ids"]) == 4 and dataset[1]["input_ids"][-1] == 2


def test_collator_pads_everything_together():
    collate = NumericCollator(pad_token_id=0)
    batch = collate(
        [
            {"input_ids": [11, 5, 2], "numeric_values": [0.0, 2.5, 0.0]},
            {"input_ids": [12], "numeric_values": [0.0]},
        ]
    )
    assert batch["input_ids"].tolist() == [[11, 5, 2], [12, 0, 0]]
    assert batch["numeric_values"].dtype == torch.float64  # values stay float64 up to the model
    assert batch["numeric_values"].tolist() == [[0.0, 2.5, 0.0], [0.0, 0.0, 0.0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[11, 5, 2], [12, -100, -100]]
    left = NumericCollator(pad_token_id=0, padding_side="left", pad_to_multiple_of=4)(
        [{"input_ids": [7, 8], "numeric_values": [0.0, 0.0]}]
    )
    assert left["input_ids"].tolist() == [[0, 0, 7, 8]] and left["labels"].tolist() == [[-100, -100, 7, 8]]


def test_collator_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="example 0: 'numeric_values' has 1 entries but input_ids has 2"):
        NumericCollator(0)([{"input_ids": [1, 2], "numeric_values": [0.0]}])


# ---- config ------------------------------------------------------------------------------------------------
def test_config_overrides_and_types(tmp_path):
    path = write(tmp_path / "c.yaml", "data: x.jsonl\nmax_steps: 10\nlearning_rate: 1e-3\nreport_to: none\n")
    config = load_train_config(path, ["max_steps=60", "model_config.ovr_negatives=2048", "gradient_checkpointing=true"])
    assert config.max_steps == 60 and config.learning_rate == 1e-3
    assert config.model_config["ovr_negatives"] == 2048  # the config's entry over the recipe's 256
    assert config.activation_checkpointing is True and config.report_to == ["none"]
    assert parse_override("split_at=2015/01/01") == ("split_at", "2015/01/01")


def test_recipe_fills_what_the_config_leaves_out_by_the_kind_of_base(tmp_path):
    """A four-key config gets the random recipe on a random preset (or a folder converted from one), the
    pretrained recipe on anything else; keys the config gives are kept, and the line says what the recipe set."""
    four = "data: x.csv\ntemplate: 'a {a} b {b}'\ntarget: b\nsplit_by: a\nsplit_at: 3\n"
    random_run = load_train_config(write(tmp_path / "r.yaml", four + "model: random:tiny\n"))
    assert random_run.recipe == "random" and random_run.freeze_backbone is False
    assert random_run.learning_rate == 3e-2 and random_run.regression_warm_start == 1.0
    assert random_run.num_token_warm_start is False  # a random base's <NUM> row is no worse than any other
    assert random_run.location_check == "seeded"  # checks locations on a random split's slice only
    real = load_train_config(write(tmp_path / "p.yaml", four + "model: qwen.gguf\nlearning_rate: 2e-5\n"))
    assert real.recipe == "pretrained" and real.freeze_backbone is True and real.learning_rate == 2e-5
    assert real.regression_warm_start == "auto" and real.num_token_warm_start == 1e-3 and real.interval_check == 0.1
    assert real.location_check is True  # on either slice; it shrinks only a forecast the median beats there
    line = real.recipe_line()
    assert line.startswith("recipe: pretrained (base qwen.gguf)") and "freeze_backbone=True" in line
    assert "learning_rate=2e-05" not in line  # given by the config, not the recipe
    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "causal_qwen", "converted_from": "random:small"}')
    assert load_train_config(write(tmp_path / "f.yaml", four + f"model: {folder}\n")).recipe == "random"
    forced = load_train_config(write(tmp_path / "x.yaml", four + "model: random:tiny\nrecipe: pretrained\n"))
    assert forced.freeze_backbone is True
    assert load_train_config(write(tmp_path / "l.yaml", four + "model: q.gguf\nlora: true\n")).freeze_backbone is False
    with pytest.raises(ValueError, match="recipe must be auto, random or pretrained"):
        load_train_config(write(tmp_path / "bad.yaml", four + "recipe: fast\n"))
    with pytest.raises(ValueError, match="location_check must be true, seeded, false or null, got 'sometimes'"):
        load_train_config(write(tmp_path / "lc.yaml", four + "location_check: sometimes\n"))
    # each config file trains into a folder of its own name unless it names one
    assert (random_run.output_dir, real.output_dir) == (str(Path("runs") / "r"), str(Path("runs") / "p"))
    named = load_train_config(write(tmp_path / "n.yaml", four + "output_dir: out/here\n"), ["max_steps=2"])
    assert named.output_dir == "out/here"
    assert load_train_config(tmp_path / "r.yaml", ["output_dir=elsewhere"]).output_dir == "elsewhere"
    # a saved run's config (every value set) reloads as it was
    again = load_train_config(write(tmp_path / "again.yaml", yaml.safe_dump(real.to_dict())))
    assert again.to_dict() == real.to_dict() and again.recipe_filled == []


def test_unknown_config_key_suggests_nearest(tmp_path):
    path = write(tmp_path / "c.yaml", "data: x.jsonl\nlearnig_rate: 0.1\n")
    with pytest.raises(ValueError, match=r"c\.yaml: unknown config key 'learnig_rate'; did you mean 'learning_rate'\?"):
        load_train_config(path)
    with pytest.raises(ValueError, match=r"--set max_step=3: unknown config key 'max_step'; did you mean 'max_steps'\?"):
        load_train_config(write(tmp_path / "ok.yaml", "data: x.jsonl\n"), ["max_step=3"])
    with pytest.raises(ValueError, match=r"unknown model_config key 'ovr_negative'.*did you mean 'model_config.ovr_negatives'"):
        load_train_config(write(tmp_path / "m.yaml", "data: x.jsonl\nmodel_config: {ovr_negative: 3}\n"))


def test_config_value_errors(tmp_path):
    with pytest.raises(ValueError, match=r"a\.yaml: max_steps must be an integer, got 'many'"):
        load_train_config(write(tmp_path / "a.yaml", "data: x\nmax_steps: many\n"))
    with pytest.raises(ValueError, match=r"^--set max_steps=abc: max_steps must be an integer, got 'abc'"):
        load_train_config(write(tmp_path / "f.yaml", "data: x\n"), ["max_steps=abc"])
    with pytest.raises(ValueError, match=r"^--set batch_size=0: batch_size must be >= 1"):
        load_train_config(write(tmp_path / "g.yaml", "data: x\n"), ["batch_size=0"])
    with pytest.raises(ValueError, match="data is required"):
        load_train_config(write(tmp_path / "b.yaml", "max_steps: 3\n"))
    with pytest.raises(ValueError, match="lora cannot be combined with freeze_backbone"):
        load_train_config(write(tmp_path / "c.yaml", "data: x\nlora: true\nfreeze_backbone: true\n"))
    with pytest.raises(ValueError, match="must be a mapping"):
        load_train_config(write(tmp_path / "d.yaml", "- a\n- b\n"))
    with pytest.raises(ValueError, match="num_token_warm_start must be a positive ridge, false or null"):
        load_train_config(write(tmp_path / "e.yaml", "data: x\nnum_token_warm_start: 0\n"))
    # A model_config value is checked with the config, before any data is read (data: x does not exist).
    with pytest.raises(ValueError, match=r"^--set model_config.ovr_negatives=-3: CausalQwenConfig.ovr_negatives must "
                                         r"be a positive int or None, got -3"):
        load_train_config(write(tmp_path / "h.yaml", "data: x\n"), ["model_config.ovr_negatives=-3"])
    with pytest.raises(ValueError, match=r"i\.yaml: .*CausalQwenConfig.noise_mode must be one of"):
        load_train_config(write(tmp_path / "i.yaml", "data: x\nmodel_config:\n  noise_mode: loud\n"))
    load_train_config(write(tmp_path / "j.yaml", "data: x\n"), ["model_config.num_token_id=200000"])  # a larger base


def test_a_dotted_target_column_is_named_as_the_cause(tmp_path):
    """R writes iris's columns as Sepal.Length: a format string reads '{Petal.Length}' as an attribute of 'Petal',
    so the config's target check says so rather than that the target is not among (Species, Sepal, Petal)."""
    config = "data: iris.csv\ntemplate: 'A {Species}, sepal {Sepal.Length}: petal {Petal.Length}.'\n"
    with pytest.raises(ValueError, match=r"i\.yaml: target 'Petal\.Length' cannot be a template field: a '\.' or '\['.*"
                                         r"rename the column"):
        load_train_config(write(tmp_path / "i.yaml", config + "target: Petal.Length\n"))


def test_example_config_loads():
    config = load_train_config(Path(__file__).resolve().parents[1] / "examples" / "seattle_weather.yaml", ["max_steps=60"])
    assert config.data == "vega:seattle-weather.csv" and config.split_by == "date" and config.max_steps == 60
    docs = read_documents(DataSource(path=config.data, template=config.template, split_by=config.split_by))
    train, valid = split_documents(docs, SplitSpec(split_by=config.split_by, split_at=config.split_at))
    assert len(docs) == 1461 and len(valid) == 365 and len(train) == 1096


def test_plain_text_with_a_target_is_an_error(tmp_path):
    path = write(tmp_path / "d.txt", "It was 12.5 C.\n")
    with pytest.raises(ValueError, match=r"d\.txt: plain text files have no fields; template, split_by and target"):
        read_documents(DataSource(path=path, target="high"))


def test_a_folder_as_data_is_named_a_folder(tmp_path):
    with pytest.raises(ValueError, match=r"data file '.*' is a folder; name a file in it"):
        resolve_data_path(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_data_path(str(tmp_path / "missing.csv"))


def test_a_relative_data_path_is_read_from_the_working_directory_and_a_miss_says_where(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    write(folder / "rows.csv", "a,b\n1,2\n")
    config_file = write(folder / "c.yaml", "model: random:tiny\ndata: rows.csv\ntemplate: 'a {a} b {b}'\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"data 'rows.csv' is not in the working directory .* but is in the "
                                                r"config's folder; .* run from .*project or write data: .*rows.csv"):
        load_train_config(config_file)
    with pytest.raises(FileNotFoundError, match=r"'rows.csv' does not exist \(relative paths are read from the working "
                                                r"directory, "):
        resolve_data_path("rows.csv")
    monkeypatch.chdir(folder)
    assert load_train_config(config_file).data == "rows.csv"
    assert resolve_data_path("rows.csv") == Path("rows.csv")


def test_a_json_integer_beyond_float_range_is_no_number(tmp_path):
    rows = '{"day": 1, "high": 10.5}\n{"day": 2, "high": 11}\n{"day": 3, "high": 1' + "0" * 400 + "}\n"
    path = write(tmp_path / "d.jsonl", rows)
    with pytest.raises(ValueError, match=r"d\.jsonl: line 3: template field 'high' holds 1000+, which is not a number"):
        read_documents(DataSource(path=path, template="day {day} high {high}"))


def test_a_json_array_of_records_is_read_as_its_rows(tmp_path):
    """A .json file as most tools write one (pandas orient="records", vega-datasets' tables): its records are the
    rows, named by their number in messages."""
    path = write(tmp_path / "d.json", '[\n  {"day": 1, "high": 10.5},\n  {"day": 2, "high": 11}\n]\n')
    documents = read_documents(DataSource(path=path, template="day {day} high {high}", target="high"))
    assert [(document.text, document.row) for document in documents] == [("day 1 high 10.5", 1), ("day 2 high 11", 2)]
    path = write(tmp_path / "bad.json", '[{"day": 1, "high": 10.5}, {"day": 2, "high": "hot"}]')
    with pytest.raises(ValueError, match=r"bad\.json: record 2: target field 'high' holds 'hot'"):
        read_documents(DataSource(path=path, template="day {day} high {high}", target="high"))
    path = write(tmp_path / "mixed.json", '[{"day": 1, "high": 10.5}, 7]')
    with pytest.raises(ValueError, match=r"mixed\.json: record 2 is a JSON int, not an object"):
        read_documents(DataSource(path=path, template="day {day} high {high}"))
    cars = read_documents(DataSource(path="vega:cars", template="{Name}: {Horsepower} hp, {Miles_per_Gallon} mpg",
                                     target="Miles_per_Gallon", skip_bad_rows=True))
    assert len(cars) > 350 and cars[0].text.startswith("chevrolet chevelle malibu: 130 hp, 18 mpg")
    path = write(tmp_path / "e.jsonl", '{"text": "a 1"}\n[\n')  # a bad line after good ones stays a bad line
    with pytest.raises(ValueError, match=r"e\.jsonl: line 2 is not valid JSON"):
        read_documents(DataSource(path=path))


def test_a_csv_split_by_semicolons_is_named(tmp_path):
    path = write(tmp_path / "s.csv", "day;high\n1;10.5\n")
    with pytest.raises(ValueError, match=r"template field 'day' is not a column \(columns: day;high\); the header is "
                                         r"one column, split by ';': write the file with ','"):
        read_documents(DataSource(path=path, template="day {day} high {high}"))


def test_a_csv_header_that_names_a_column_twice_is_an_error(tmp_path):
    path = write(tmp_path / "twice.csv", "day,high,high\n1,10.5,11.0\n")
    with pytest.raises(ValueError, match=r"twice.csv: row 0 \(header\): the column names 'high' appear more than once"):
        read_documents(DataSource(path=path, template="day {day} high {high}"))


def test_a_csv_row_is_named_by_the_line_it_starts_on_when_a_cell_holds_newlines(tmp_path):
    rows = 'note,temp_max\n"two\nlines",12.8\n"three\nmore\nlines",warm\n'
    path = write(tmp_path / "notes.csv", rows)
    with pytest.raises(ValueError, match=r"notes\.csv: row 2 \(line 4\): template field 'temp_max' holds 'warm'"):
        read_documents(DataSource(path=path, template="{note}: {temp_max} C", numeric_fields=["temp_max"]))


def test_a_csv_written_with_spaces_after_its_commas_reads_its_names_and_cells_without_them(tmp_path):
    """``date, city, price`` (a hand-written or exported CSV) names the columns ``date``, ``city`` and ``price``, and
    ``2020-01-01, Oslo, 12.5`` fills the template with ``Oslo``, not `` Oslo``; a quoted cell keeps its comma."""
    path = write(tmp_path / "spaced.csv", 'date, city, price\n2020-01-01, Oslo, 12.5\n2020-01-02, "Paris, TX", 7\n')
    docs = read_documents(DataSource(path=path, template="{city} on {date}: {price} dollars.", target="price",
                                     split_by="date"))
    assert [doc.text for doc in docs] == ["Oslo on 2020-01-01: 12.5 dollars.", "Paris, TX on 2020-01-02: 7 dollars."]
    assert [doc.target_value for doc in docs] == [12.5, 7.0] and docs[1].split_value == "2020-01-02"
    twice = write(tmp_path / "twice.csv", "day, high,high\n1,10.5,11.0\n")
    with pytest.raises(ValueError, match=r"the column names 'high' appear more than once"):
        read_documents(DataSource(path=twice, template="day {day} high {high}"))


def test_empty_text_cells_are_counted_in_one_warning(tmp_path, caplog):
    """A text field left empty fills the template with nothing; reading says how many rows did so, once."""
    path = write(tmp_path / "gaps.csv", "city,price\nOslo,12.5\n,7\n  ,8\n")
    with caplog.at_level("WARNING"):
        docs = read_documents(DataSource(path=path, template="{city}: {price} dollars.", target="price"))
    assert [doc.text for doc in docs] == ["Oslo: 12.5 dollars.", ": 7 dollars.", ": 8 dollars."]
    warnings = [record.getMessage() for record in caplog.records if "empty" in record.getMessage()]
    assert len(warnings) == 1 and "2 of 3 rows leave the text field 'city' empty" in warnings[0]


def test_train_keys_lists_every_setting_with_its_default_and_what_it_does(capsys):
    """``causal-qwen train --keys``: each `TrainConfig` key, its default and its description (the docstring under
    its field); a key added without one fails here. Without a config and without --keys: a one-line error."""
    from causal_qwen.cli import main
    from causal_qwen.training.train_config import key_docs, valid_keys

    docs = key_docs()
    assert [key for key in valid_keys() if not docs.get(key, "").strip()] == []
    assert main(["train", "--keys"]) == 0
    printed = capsys.readouterr().out
    listed = re.findall(r"^(\w+): (.*)$", printed, flags=re.MULTILINE)
    assert [key for key, _ in listed] == valid_keys()
    assert dict(listed)["max_steps"] == "null" and dict(listed)["lr_scheduler_type"] == "cosine"
    assert "    Skip a row that cannot be read" in printed  # skip_bad_rows' description, indented under it
    assert main(["train"]) == 2
    assert "give the training config (a YAML file), or --keys" in capsys.readouterr().err


def test_split_values_and_split_at_with_thousands_separators_are_numbers():
    docs = docs_with_dates(["900", "950", "1,000", "1,050", "$1,100"])
    train, valid = split_documents(docs, SplitSpec(split_by="step", split_at="1,000"))
    assert [d.split_value for d in train] == ["900", "950"] and len(valid) == 3
    train, valid = split_documents(docs, SplitSpec(split_by="step", split_at=1050))
    assert [d.split_value for d in valid] == ["1,050", "$1,100"]


@pytest.mark.parametrize(("dates", "cut", "train_size"), [
    (["01/01/2020 3:15 PM", "01/02/2020 9:00 AM", "01/13/2020 3:15 PM"], "2020-01-02", 1),
    (["1/31/2020 18:00", "2/1/2020 18:00", "2/3/2020 6:00"], "2020-02-01", 1),
    (["31/01/2020 18:00", "01/02/2020 18:00", "03/02/2020 6:00"], "2020-02-01", 1),
    (["31.01.2020 18:00", "01.02.2020 18:00:30", "03.02.2020 6:00"][::2], "2020-02-01", 1),
    (["Wed, 01 Jan 2020", "Thu, 02 Jan 2020", "Fri, 03 Jan 2020"], "2020-01-02", 1),
])
def test_excel_date_times_split(dates, cut, train_size):
    train, valid = split_documents(docs_with_dates(dates), SplitSpec(split_by="Date", split_at=cut))
    assert len(train) == train_size and len(valid) == len(dates) - train_size


def test_month_first_date_times_that_also_read_day_first_warn(caplog):
    with caplog.at_level("WARNING", logger="causal_qwen.training.data"):
        train, valid = split_documents(docs_with_dates(["01/02/2020 3:15 PM", "02/03/2020 3:15 PM"]),
                                       SplitSpec(split_by="Date", split_at="2020-01-15"))
    assert len(train) == len(valid) == 1  # month first: January 2, February 3
    assert "read as month/day/year (%m/%d/%Y %I:%M %p); every value also reads as day/month/year" in caplog.text


def test_an_iso_column_with_one_month_first_date_names_that_date_once(caplog):
    """ISO dates read whatever the column's format, so one ``06/01/1854`` among them makes the column month first:
    the warning named an ISO date as the one read month first, and came once per reading of the column (three a
    run: the split, the check slice, the warm start's order)."""
    dates = ["1854-04-01", "1854-05-01", "06/01/1854", "1854-07-01", "1854-08-01"]
    with caplog.at_level("WARNING", logger="causal_qwen.training.data"):
        for _ in range(3):
            train, valid = split_documents(docs_with_dates(dates), SplitSpec(split_by="Date", split_at="1854-06-15"))
            assert len(train) == 3 and len(valid) == 2  # June 1st is before the cut
    warnings = [record.getMessage() for record in caplog.records if "month/day/year" in record.getMessage()]
    assert warnings == ["split_by column 'Date': dates such as '06/01/1854' read as month/day/year (%m/%d/%Y); "
                        "every value also reads as day/month/year"]


def test_a_date_column_mixing_offsets_and_none_warns(caplog):
    mixed = docs_with_dates(["2020-01-01T20:00:00", "2020-01-02T20:00:00-05:00", "2020-01-03T20:00:00"])
    with caplog.at_level("WARNING", logger="causal_qwen.training.data"):
        train, valid = split_documents(mixed, SplitSpec(split_by="date", split_at="2020-01-03"))
    assert [d.split_value for d in valid] == ["2020-01-02T20:00:00-05:00", "2020-01-03T20:00:00"]  # 01:00 UTC, 3rd
    assert caplog.text.count("mixes dates with a time-zone offset") == 1
    caplog.clear()
    aware = docs_with_dates(["2020-01-01T20:00:00-05:00", "2020-01-03T20:00:00-05:00"])
    with caplog.at_level("WARNING", logger="causal_qwen.training.data"):
        train, valid = split_documents(aware, SplitSpec(split_by="date", split_at="2020-01-03"))
    assert "mixes" not in caplog.text and len(train) == len(valid) == 1
    assert ("'2020-01-01T20:00:00-05:00' is 2020-01-02 01:00:00), and split_at '2020-01-03', without one, as UTC"
            in caplog.text)
    caplog.clear()
    with caplog.at_level("WARNING", logger="causal_qwen.training.data"):  # "Z" is UTC: nothing moves
        split_documents(docs_with_dates(["2020-01-01T20:00:00Z", "2020-01-03T20:00:00Z"]),
                        SplitSpec(split_by="date", split_at="2020-01-03"))
    assert "time-zone offset" not in caplog.text


def test_a_json_file_that_is_one_object_is_named(tmp_path):
    wrapped = write(tmp_path / "w.json", '{\n "data": [\n  {"text": "a 1"},\n  {"text": "b 2"}\n ]\n}\n')
    columns = write(tmp_path / "c.json", '{"day": ["2020-01-01", "2020-01-02"], "price": [1.5, 2.5]}\n')
    for path in (wrapped, columns):
        with pytest.raises(ValueError, match=r"\.json: the file is one JSON object, not one per line \(JSON Lines\); "
                                             r"write one record per line, e.g\. pandas to_json\(orient=\"records\", "
                                             r"lines=True\)"):
            read_documents(DataSource(path=path, template="On {day} {price}", target="price"))
    one = write(tmp_path / "one.jsonl", '{"day": "2020-01-01", "price": 1.5}\n')  # one record stays one record
    assert read_documents(DataSource(path=one, template="On {day} {price}", target="price"))[0].target_value == 1.5


def test_a_bang_in_a_template_field_name_is_explained():
    with pytest.raises(ValueError, match=r"template 'On \{date\}: \{Price!\}\.' is not a valid format string: "
                                         r".*; a '!' in a field name starts a conversion \(!r, !s, !a\): rename"):
        template_fields("On {date}: {Price!}.")


def test_a_tokenizer_that_reads_the_target_otherwise_is_named(tokenizer):
    """`tokenize_documents` checks that the tokenizer reads each target as the data did: a tokenizer saved with
    decimal commas (``convert --decimal-comma``) reads a table's ``14.3`` as text, and training says why."""
    from causal_qwen.core.tokenizer import NumericTokenizer

    row = Document("alcohol 14.3 percent, ash 2.72.", "wine.csv", 17, target_ordinal=0, target_value=14.3)
    [example] = tokenize_documents([row], tokenizer, max_length=32)  # the default grammar: read as the data reads it
    assert 14.3 in example["numeric_values"]
    german = NumericTokenizer.default(decimal_comma=True)
    with pytest.raises(ValueError, match=r"wine.csv: row 17: the tokenizer does not read the target as the data "
                                         r"does: it reads 0 numbers, not 14.3, .*converted without --decimal-comma"):
        tokenize_documents([row], german, max_length=32)
    misread = Document("alcohol 14.3 percent.", "wine.csv", 18, target_ordinal=0, target_value=14.0)
    with pytest.raises(ValueError, match=r"row 18: .*its number 0 is 14.3, not 14.0"):
        tokenize_documents([misread], tokenizer, max_length=32)


def test_a_format_spec_formats_a_whole_number_cell_as_an_integer(tmp_path):
    """``{visitors:,}`` writes 12,345 (not 12,345.0) and ``{day:02d}`` formats the cell; a decimal cell stays a
    float."""
    path = write(tmp_path / "f.csv", "day,visitors,sold\n1,12345,3.5\n2,\"1,200\",4\n")
    documents = read_documents(DataSource(path=path, template="Day {day:02d}: {visitors:,} visitors, sold {sold:.2f}.",
                                          target="sold"))
    assert [document.text for document in documents] == ["Day 01: 12,345 visitors, sold 3.50.",
                                                         "Day 02: 1,200 visitors, sold 4.00."]


def test_a_dotted_key_of_a_json_object_names_the_bracket_form(tmp_path):
    path = write(tmp_path / "n.jsonl", '{"meta": {"city": "Rome"}, "t": 20.5}\n')
    with pytest.raises(ValueError, match=r"'meta' holds a JSON object, whose keys a template reads as \{meta\[key\]\}"):
        read_documents(DataSource(path=path, template="In {meta.city} it was {t}.", target="t"))
    documents = read_documents(DataSource(path=path, template="In {meta[city]} it was {t}.", target="t"))
    assert documents[0].text == "In Rome it was 20.5."
