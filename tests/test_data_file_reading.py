"""Reading data files as users save them: a UTF-8 byte-order mark, non-UTF-8 bytes, numbers written with thousands
separators, and an unquoted YAML date as ``split_at`` (`causal_qwen.training.data`, `train_config`)."""

from __future__ import annotations

import datetime
import gzip
import logging
import re

import pytest

from causal_qwen.training.data import DataSource, SplitSpec, describe_split, read_documents, split_documents
from causal_qwen.training.train_config import load_train_config

TEMPLATE = "On {day} the shop had {visitors} visitors and sold {sold} items."


def shop_csv(rows: int = 40, sold: dict[int, str] | None = None) -> str:
    """A small shop table; ``sold`` replaces the sold cell of some rows (0-based) with a spelling of its own."""
    lines = ["day,visitors,sold"]
    for i in range(rows):
        day = datetime.date(2024, 1, 1) + datetime.timedelta(days=i)
        lines.append(f"{day},{90 + i},{(sold or {}).get(i, f'{20 + i * 0.3:.1f}')}")
    return "\n".join(lines) + "\n"


def shop_source(path, **kwargs) -> DataSource:
    return DataSource(path=str(path), template=TEMPLATE, target="sold", split_by="day", **kwargs)


def test_csv_with_utf8_byte_order_mark_reads_its_first_column(tmp_path):
    path = tmp_path / "shop.csv"
    path.write_text(shop_csv(), encoding="utf-8-sig")  # Excel's "CSV UTF-8"
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    docs = read_documents(shop_source(path))
    assert len(docs) == 40
    assert docs[0].text == "On 2024-01-01 the shop had 90 visitors and sold 20.0 items."
    assert docs[0].split_value == "2024-01-01"


def test_jsonl_with_utf8_byte_order_mark_reads_its_first_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "It costs 9.5 dollars."}\n{"text": "Two"}\n', encoding="utf-8-sig")
    assert [d.text for d in read_documents(DataSource(path=str(path)))] == ["It costs 9.5 dollars.", "Two"]


def test_non_utf8_csv_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.csv"
    text = shop_csv(5).replace("2024-01-03,92,", "2024-01-03,92,grün ", 1)
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError) as info:
        read_documents(shop_source(path))
    message = str(info.value)
    assert str(path) in message and "line 4" in message
    assert "not UTF-8" in message and "save the file as UTF-8" in message


def test_target_with_thousands_separator_reads_as_the_grammars_number(tmp_path):
    path = tmp_path / "shop.csv"
    path.write_text(shop_csv(sold={4: '"29,900"', 5: '"29.9%"', 6: '"1,234.50"'}), encoding="utf-8")
    docs = read_documents(shop_source(path))
    assert docs[4].text == "On 2024-01-05 the shop had 94 visitors and sold 29,900 items."
    assert [docs[i].target_value for i in (3, 4, 5, 6)] == [20.9, 29900.0, 29.9, 1234.5]
    assert docs[4].target_ordinal == docs[3].target_ordinal == 1


@pytest.mark.parametrize("cell", ['"1,2"', "5km", "007x", "inf", "nan", '"12 345"'])
def test_target_that_is_not_exactly_one_number_is_rejected(tmp_path, cell):
    path = tmp_path / "shop.csv"
    path.write_text(shop_csv(sold={2: cell}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"row 3 \(line 4\).*'sold'.*not a number"):
        read_documents(shop_source(path))


@pytest.mark.parametrize("cell", ["+5", "5.", "29,900"])
def test_cells_the_grammar_reads_as_their_number_give_no_warning(tmp_path, caplog, cell):
    path = tmp_path / "shop.csv"
    path.write_text(shop_csv(sold={0: f'"{cell}"'}), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="causal_qwen.training.data"):
        docs = read_documents(shop_source(path))
    assert docs[0].target_value == float(cell.replace(",", ""))
    assert "does not read" not in caplog.text


def test_numeric_cell_the_grammar_reads_as_text_warns_once(tmp_path, caplog):
    path = tmp_path / "shop.csv"
    path.write_text(shop_csv().replace("2024-01-01,90,", "2024-01-01,090,", 1), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="causal_qwen.training.data"):
        docs = read_documents(shop_source(path))
    assert docs[0].target_value == 20.0 and docs[0].target_ordinal == 0  # "090" stays text: "20.0" is the first
    assert caplog.text.count("does not read as one number") == 1 and "'visitors'" in caplog.text


def test_target_cell_the_grammar_reads_as_text_is_a_bad_row(tmp_path):
    path = tmp_path / "shop.csv"
    path.write_text(shop_csv(sold={0: "007"}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"row 1 \(line 2\).*does not read the target field 'sold' \('007'\)"):
        read_documents(shop_source(path))
    docs = read_documents(shop_source(path, skip_bad_rows=True))
    assert len(docs) == 39 and docs[0].row == 2


@pytest.mark.parametrize(("cells", "count", "hint"), [("2024-01-02,1,234.5,21.0", 4, "must be quoted"),
                                                      ("2024-01-02,91", 2, "")])
def test_a_row_with_more_or_fewer_cells_than_the_header_is_a_bad_row(tmp_path, caplog, cells, count, hint):
    """An unquoted ``1,234.5`` gives a row one cell too many: read as it was, every later value would shift one
    column along without a word (the 234.5 taken for the sold items, the 21.0 dropped). A short row is named the
    same way; each says how to skip such rows."""
    path = tmp_path / "shop.csv"
    lines = shop_csv().splitlines()
    lines[2] = cells
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"row 2 \(line 3\): {count} cells where the header has 3 columns.*{hint}") as caught:
        read_documents(shop_source(path))
    assert "skip_bad_rows: true" in str(caught.value)
    with caplog.at_level(logging.WARNING, logger="causal_qwen.training.data"):
        docs = read_documents(shop_source(path, skip_bad_rows=True))
    assert len(docs) == 39 and [doc.row for doc in docs[:2]] == [1, 3] and "skipped 1 bad rows of 40" in caplog.text


@pytest.mark.parametrize(("template", "ordinal"), [("s1 {visitors} v2 {sold}", 1), ("x1: {sold}", 0)])
def test_a_label_ending_in_a_digit_does_not_hide_the_number_after_it(tmp_path, caplog, template, ordinal):
    path = tmp_path / "shop.csv"
    path.write_text(shop_csv(), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="causal_qwen.training.data"):
        docs = read_documents(DataSource(path=str(path), template=template, target="sold"))
    assert docs[1].target_value == 20.3 and docs[1].target_ordinal == ordinal
    assert "does not read" not in caplog.text


@pytest.mark.parametrize("template", ["On {day} item-{sold} sold", "sold {sold}_units", "v{sold}"])
def test_target_glued_to_the_template_text_stops_with_the_text(tmp_path, template):
    path = tmp_path / "shop.csv"
    path.write_text(shop_csv(), encoding="utf-8")
    with pytest.raises(ValueError, match=r"row 1 \(line 2\): the tokenizer does not read the target field 'sold' "
                                         r"\('20.0'\) as one number in the text"):
        read_documents(DataSource(path=str(path), template=template, target="sold"))


def test_unquoted_yaml_date_split_at_is_iso_text(tmp_path):
    data = tmp_path / "shop.csv"
    data.write_text(shop_csv(), encoding="utf-8")
    config_path = tmp_path / "train.yaml"
    config_path.write_text(
        f"data: {data}\ntemplate: \"{TEMPLATE}\"\ntarget: sold\nsplit_by: day\nsplit_at: 2024-02-01\n", encoding="utf-8"
    )
    config = load_train_config(config_path)
    assert config.split_at == "2024-02-01"
    spec = SplitSpec(split_by=config.split_by, split_at=config.split_at)
    assert describe_split(spec) == "split by day at '2024-02-01'"
    train, validation = split_documents(read_documents(shop_source(data)), spec)
    assert (len(train), len(validation)) == (31, 9)
    assert validation[0].split_value == "2024-02-01"

    timed = load_train_config(config_path, ["split_at=2024-02-01 12:30:00"])
    assert timed.split_at == "2024-02-01T12:30:00"
    train, validation = split_documents(read_documents(shop_source(data)), SplitSpec(split_by="day",
                                                                                     split_at=timed.split_at))
    assert (len(train), len(validation)) == (32, 8)


def test_a_column_with_a_dot_in_its_name_is_explained(tmp_path):
    path = tmp_path / "stocks.csv"
    path.write_text("Date,Adj. Close\n2024-01-02,10.5\n2024-01-03,11.0\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"template field '\{Adj\. Close\}': a '\.' or '\[' in a field name .*"
                                         r"'Adj'.*rename the column"):
        read_documents(DataSource(path=str(path), template="On {Date} it closed at {Adj. Close}", target="Adj. Close"))


def test_the_target_value_is_the_number_the_text_shows(tmp_path):
    path = tmp_path / "shop.csv"
    path.write_text(shop_csv(sold={0: "12.84"}), encoding="utf-8")
    docs = read_documents(DataSource(path=str(path), template="sold {sold:.1f} on {day}", target="sold"))
    assert docs[0].text.startswith("sold 12.8 on") and docs[0].target_value == 12.8


def test_eval_data_skips_the_rows_training_skipped(tmp_path):
    from causal_qwen.evaluation.evaluation import EvalData, load_documents

    path = tmp_path / "shop.csv"
    path.write_text(shop_csv(sold={3: "007"}), encoding="utf-8")
    spec = dict(path=str(path), template=TEMPLATE, target="sold")
    with pytest.raises(ValueError, match="does not read the target field 'sold'"):
        load_documents(EvalData(**spec))
    assert len(load_documents(EvalData(**spec, skip_bad_rows=True))) == 39


def test_a_guessed_numeric_field_writes_its_text_cells_as_text_beside_a_target(tmp_path, caplog):
    """A context field guessed numeric (``12``, ``13``, ``12 Pro``) writes a cell that is no number as its text and
    says so once; the field keeps its numbers' spelling. A field the config lists in numeric_fields, or the target,
    still stops at such a cell, saying why it must be a number."""
    path = tmp_path / "phones.csv"
    path.write_text("day,model,sold\n2024-01-01,12,20.5\n2024-01-02,13,21\n2024-01-03,12 Pro,22\n", encoding="utf-8")
    template = "On {day} the model {model} sold {sold}."
    with caplog.at_level(logging.WARNING, logger="causal_qwen.training.data"):
        docs = read_documents(DataSource(path=str(path), template=template, target="sold"))
    assert [doc.text for doc in docs][1:] == ["On 2024-01-02 the model 13 sold 21.",
                                              "On 2024-01-03 the model 12 Pro sold 22."]
    assert [doc.target_value for doc in docs] == [20.5, 21.0, 22.0]
    assert "1 of 3 rows hold text in the field 'model', whose other cells are numbers (such as '12 Pro')" in caplog.text
    with pytest.raises(ValueError, match=r"row 3 \(line 4\): template field 'model' holds '12 Pro', which is not a "
                                         r"number \(numeric_fields lists it\)"):
        read_documents(DataSource(path=str(path), template=template, target="sold", numeric_fields=["model", "sold"]))
    path.write_text("day,model,sold\n2024-01-01,12,20.5\n2024-01-02,13,21\n2024-01-03,12,n/a\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"row 3 \(line 4\): template field 'sold' holds 'n/a', which is not a "
                                         r"number \(it is the target\)"):
        read_documents(DataSource(path=str(path), template=template, target="sold"))


def test_numbers_with_three_digits_after_a_dot_warn_of_thousands_dots_and_a_decimal_comma_is_named(tmp_path, caplog):
    path = tmp_path / "shop.csv"
    path.write_text("day,sold\n2024-01-01,2.078\n2024-01-02,2.474\n2024-01-03,1.980\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="causal_qwen.training.data"):
        docs = read_documents(DataSource(path=str(path), template="On {day} it sold {sold}.", target="sold"))
    assert docs[0].target_value == 2.078  # read as written, but said
    assert caplog.text.count("three digits after a dot") == 1
    assert "the field 'sold' has three digits after a dot (such as '2.078', read as 2.078)" in caplog.text
    assert "write the numbers without it (2078)" in caplog.text
    caplog.clear()
    path.write_text(shop_csv(), encoding="utf-8")  # 20.0, 20.3, ...: no warning
    with caplog.at_level(logging.WARNING, logger="causal_qwen.training.data"):
        read_documents(shop_source(path))
    assert "three digits after a dot" not in caplog.text
    path.write_text(shop_csv(sold={1: '"2.078,0"'}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"row 2 \(line 3\): .*'sold' holds '2.078,0', which is not a number; decimal "
                                         r"commas are not read in data cells"):
        read_documents(shop_source(path))


def test_a_text_file_holding_a_table_and_a_compressed_file_name_the_fix(tmp_path):
    table = tmp_path / "shop.txt"
    table.write_text(shop_csv(3), encoding="utf-8")
    with pytest.raises(ValueError, match=r"shop\.txt: plain text files have no fields; .*: if the \.txt file holds a "
                                         r"CSV table \(or JSON Lines\), set data_format: csv \(or jsonl\)"):
        read_documents(shop_source(table))
    assert len(read_documents(shop_source(table, format="csv"))) == 3
    packed = tmp_path / "shop.csv.gz"
    packed.write_bytes(gzip.compress(shop_csv(3).encode()))
    with pytest.raises(ValueError, match=r"shop\.csv\.gz: compressed files \(\.gz\) are not read; unpack it first and "
                                         r"name the file inside \(e\.g\. shop\.csv\)"):
        read_documents(shop_source(packed))


def test_a_format_spec_on_a_text_field_is_a_template_error_before_any_row(tmp_path):
    path = tmp_path / "shop.csv"
    path.write_text(shop_csv(), encoding="utf-8")
    for skip in (False, True):  # not a bad row on every row, which skip_bad_rows would skip into an empty dataset
        with pytest.raises(ValueError, match=r"shop\.csv: template field '\{day:%B\}': 'day' is a text field \(cells "
                                             r"such as '2024-01-01' are text, not numbers\) and a format spec .*applies "
                                             r"to number fields only \(numeric_fields\)"):
            read_documents(DataSource(path=str(path), template="In {day:%B} it sold {sold}.", target="sold",
                                      skip_bad_rows=skip))
    docs = read_documents(DataSource(path=str(path), template="{day:>12}: {sold:.0f}", target="sold"))
    assert docs[0].text == "  2024-01-01: 20"  # a spec that formats text, and one on a number, stay


def test_rows_ending_with_an_empty_cell_past_the_header_are_read(tmp_path):
    path = tmp_path / "shop.csv"
    path.write_text("".join(line + ",\n" if i else line + "\n" for i, line in enumerate(shop_csv(5).splitlines())),
                    encoding="utf-8")
    docs = read_documents(shop_source(path))
    assert len(docs) == 5 and docs[0].text == "On 2024-01-01 the shop had 90 visitors and sold 20.0 items."
    path.write_text(shop_csv(5).replace("2024-01-02,91,20.3", "2024-01-02,91,20.3,x"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"row 2 \(line 3\): 4 cells where the header has 3 columns"):
        read_documents(shop_source(path))


@pytest.mark.parametrize(("name", "cause"), [("Temp: max", "a ':' in a field name starts a format spec"),
                                              ("Price!", r"a '!' in a field name starts a conversion")])
def test_a_column_with_a_colon_or_a_bang_in_its_name_is_explained(tmp_path, name, cause):
    path = tmp_path / "w.csv"
    path.write_text(f"date,{name},price\n2024-01-02,12,10.5\n2024-01-03,9,11.0\n", encoding="utf-8")
    template = f"On {{date}} it was {{{name}}} and cost {{price}}."
    with pytest.raises(ValueError, match=rf"w\.csv: template field '\{{{re.escape(name)}\}}': {cause}.* so the column "
                                         rf"'{re.escape(name)}' cannot be named there; rename the column"):
        read_documents(DataSource(path=str(path), template=template, target="price"))
    config = tmp_path / "c.yaml"
    config.write_text(f"data: {path}\ntemplate: '{template}'\ntarget: '{name}'\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"c\.yaml: target '{re.escape(name)}' cannot be a template field: {cause}.*"
                                         r"rename the column"):
        load_train_config(config)


def test_json_null_in_a_text_field_is_an_empty_cell_and_in_a_number_field_a_bad_row(tmp_path, caplog):
    path = tmp_path / "d.jsonl"
    path.write_text('{"note": "ok", "price": 1.5}\n{"note": null, "price": 2.5}\n', encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="causal_qwen.training.data"):
        docs = read_documents(DataSource(path=str(path), template="({note}) {price}", target="price"))
    assert [doc.text for doc in docs] == ["(ok) 1.5", "() 2.5"]
    assert "1 of 2 rows leave the text field 'note' empty" in caplog.text
    path.write_text('{"note": "ok", "price": 1.5}\n{"note": "ok", "price": null}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"d\.jsonl: line 2: template field 'price' has no value"):
        read_documents(DataSource(path=str(path), template="({note}) {price}", target="price"))
