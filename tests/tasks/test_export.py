"""Task data as files: export -> datasets.load_dataset -> load back gives the same items, bit for bit."""

import json
import struct

import numpy as np
import pytest

import bayes_lens as bl
from bayes_lens.models.tiny import tiny_tokenizer

tasks = bl.tasks
datasets = pytest.importorskip("datasets")


def _canon(x):
    """A value with its exact type and, for floats, its exact bits (so 1 != 1.0 and 0.1 != 0.1 + 1e-17)."""
    if isinstance(x, float):
        return ("float", struct.pack("<d", x))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_canon(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((k, _canon(v)) for k, v in sorted(x.items())))
    return (type(x).__name__, x)


def _same_items(a, b):
    assert type(a) is type(b) and len(a) == len(b)
    for x, y in zip(a, b):
        assert type(x) is type(y) and x.text == y.text
        assert _canon(x.as_dict()) == _canon(y.as_dict())
        for f in tasks.STANDARD_FIELDS[1:]:
            assert _canon(getattr(x, f)) == _canon(getattr(y, f)), f


def _prompt_sets():
    tok = tiny_tokenizer()
    sets = {"sula": bl.sula.make_prompts(tok, ks=(0, 1, 4), n_per_k=3, seed=4, template="is")}
    for c in bl.sula.CONTROLS:
        sets["sula_" + c] = bl.sula.make_prompts(tok, ks=(0, 2), n_per_k=3, seed=4, control=c)
    sets["categorical"] = tasks.categorical_prompts(tok, n_symbols=4, alpha=0.7, ks=(0, 3, 9), n_per_k=3, seed=2)
    sets["gaussian"] = tasks.gaussian_prompts(tok, ks=(1, 5), n_per_k=4, seed=3)
    sets["gaussian_nig"] = tasks.gaussian_prompts(tok, prior="nig", decimals=2, ks=(2,), n_per_k=4, seed=3)
    coin = [tasks.TaskItem("Sequence:" + " 1" * s, task="coin", answers=(" 0", " 1"), k=s,
                           posterior=(1 / (s + 2), (s + 1) / (s + 2)), outcome=1) for s in range(4)]
    sets["user"] = tasks.TaskPrompts(coin, task="coin", seed=None, generator_version="coin-1", params={"rule": "laplace"})
    return sets


SETS = _prompt_sets()


@pytest.mark.parametrize("name", sorted(SETS))
def test_export_datasets_load_back_is_bit_for_bit(tmp_path, name):
    prompts = SETS[name]
    path = tasks.export(prompts, tmp_path / f"{name}.jsonl")
    card = tasks.read_card(path)
    assert card["task"] == prompts.task and card["seed"] == prompts.seed and card["n_items"] == len(prompts)
    assert card["generator_version"] == prompts.generator_version and set(tasks.STANDARD_FIELDS) <= set(card["fields"])
    import hashlib
    assert card["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    # our loader
    back = tasks.load(path)
    _same_items(prompts, back)
    assert back.seed == prompts.seed and back.task == prompts.task and back.params == prompts.params
    if name.startswith("sula"):
        assert back.template == prompts.template and back.labels == prompts.labels and back.control == prompts.control
    # Hugging Face datasets reads the file as it is, and its rows load back to the same items
    ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == len(prompts) and set(tasks.STANDARD_FIELDS) <= set(ds.column_names)
    _same_items(prompts, tasks.from_records(ds, card))
    _same_items(prompts, tasks.from_records(list(ds), path))


def test_checksums_catch_edits(tmp_path):
    prompts = SETS["categorical"]
    path = tasks.export(prompts, tmp_path / "c.jsonl")
    lines = path.read_text().splitlines()
    rec = json.loads(lines[1])
    rec["posterior"][0] += 1e-15                         # a change no eye would see
    rec["posterior"][1] -= 1e-15
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join([lines[0], json.dumps(rec, sort_keys=True), *lines[2:]]) + "\n")
    tasks.card_path(edited).write_text(tasks.card_path(path).read_text())
    with pytest.raises(bl.CheckpointError, match="does not match the SHA-256"):
        tasks.load(edited)
    # the records route: a lost row, an edited row
    card = tasks.read_card(path)
    recs = [json.loads(x) for x in lines]
    with pytest.raises(bl.CheckpointError, match="checksum"):
        tasks.from_records(recs[:-1], card)
    with pytest.raises(bl.CheckpointError, match="checksum"):
        tasks.from_records([rec if i == 1 else r for i, r in enumerate(recs)], card)
    # an edited card (its own checksum), and a missing one
    c = json.loads(tasks.card_path(path).read_text())
    c["seed"] = 1
    tasks.card_path(path).write_text(json.dumps(c))
    with pytest.raises(bl.CheckpointError, match="own SHA-256"):
        tasks.load(path)
    tasks.card_path(path).unlink()
    with pytest.raises(bl.CheckpointError, match="no dataset card"):
        tasks.load(path)
    with pytest.raises(bl.BayesLensError):
        tasks.export(prompts, tmp_path / "c.txt")
    with pytest.raises(bl.BayesLensError):
        tasks.export(["plain", "strings"], tmp_path / "p.jsonl")


def test_martingale_gap_sequences_are_the_ones_gap_draws_and_export(tmp_path):
    seen = []

    def laplace_recording(x):            # a predictor callable: record what gap() feeds it
        seen.append(np.asarray(x).copy())
        return bl.martingale.laplace(x)

    bl.martingale.gap(laplace_recording, ns=(6, 8, 10), n_seqs=3, seed=7, n_boot=0)
    items = bl.martingale.gap_sequences(ns=(6, 8, 10), n_seqs=3, seed=7)
    drawn = [row.tolist() for batch in seen for row in batch]
    assert [list(it.sequence) for it in items] == drawn
    for it in items:
        assert it.text == bl.martingale.DEFAULT_TEMPLATE.render(it.sequence)
        s, n = sum(it.sequence), len(it.sequence)
        assert it.posterior[1] == pytest.approx(bl.martingale.laplace(np.array([list(it.sequence) + [0]]))[0, -1])
        assert it.posterior == pytest.approx(((n - s + 1) / (n + 2), (s + 1) / (n + 2)))
    path = tasks.export(items, tmp_path / "gap.jsonl")
    _same_items(items, tasks.load(path))
    ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    _same_items(items, tasks.from_records(ds, path))


def _rehashed(card_file, edit):
    """What anyone can do to a card: change it and recompute its own SHA-256."""
    from bayes_lens._files import sha256_json

    card = json.loads(card_file.read_text())
    edit(card)
    card.pop("card_sha256", None)
    card["card_sha256"] = sha256_json(card)
    card_file.write_text(json.dumps(card))


@pytest.mark.parametrize("bad", ["[]", '"x"', "null", "3"])
def test_a_card_that_is_not_an_object_is_a_clear_error(tmp_path, bad):
    """Issue 52 §4: a card holding [], "x" or null was a raw AttributeError."""
    path = tasks.export(SETS["categorical"], tmp_path / "c.jsonl")
    tasks.card_path(path).write_text(bad)
    for call in (lambda: tasks.load(path), lambda: tasks.read_card(path)):
        with pytest.raises(bl.CheckpointError, match="not a JSON object") as info:
            call()
        assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("edit", ["sula", "no params", "params a list", "no seed", "no sha256"])
def test_a_rehashed_card_that_does_not_fit_its_records_is_a_clear_error(tmp_path, edit):
    """Issue 52 §4: a categorical export's card re-hashed with task "sula" was a raw KeyError; so was a card
    re-hashed without the entries the loader reads."""
    path = tasks.export(SETS["categorical"], tmp_path / "c.jsonl")
    change = {"sula": lambda c: c.update(task="sula"), "no params": lambda c: c.pop("params"),
              "params a list": lambda c: c.update(params=[1]), "no seed": lambda c: c.pop("seed"),
              "no sha256": lambda c: c.pop("sha256")}[edit]
    _rehashed(tasks.card_path(path), change)
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    for call in (lambda: tasks.load(path), lambda: tasks.from_records(recs, tasks.card_path(path))):
        with pytest.raises(bl.CheckpointError) as info:
            call()
        msg = str(info.value)
        assert len(msg.splitlines()) == 1 and "export the prompt set again" in msg.lower(), msg
        if edit == "sula":
            assert "task 'sula'" in msg and "'example_labels'" in msg, msg


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_task_field_is_refused_on_export(tmp_path, value):
    """Issue 52 §4: a NaN or inf task-specific field (or parameter) was a raw ValueError from json.dumps."""
    item = tasks.TaskItem("Sequence: 1", task="coin", answers=(" 0", " 1"), posterior=(0.5, 0.5), k=1, weight=value)
    with pytest.raises(bl.InvalidInputError, match=r"item 0's field 'weight' is " + ("nan" if value != value else
                                                                                      r"-?inf")) as info:
        tasks.export(tasks.TaskPrompts([item], task="coin", seed=0, generator_version="1"), tmp_path / "c.jsonl")
    assert len(str(info.value).splitlines()) == 1 and not (tmp_path / "c.jsonl").exists()
    ok = tasks.TaskItem("Sequence: 1", task="coin", answers=(" 0", " 1"), posterior=(0.5, 0.5), k=1)
    with pytest.raises(bl.InvalidInputError, match=r"parameter 'scale' is"):
        tasks.export(tasks.TaskPrompts([ok], task="coin", seed=0, generator_version="1", params={"scale": value}),
                     tmp_path / "c.jsonl")


@pytest.mark.parametrize("text", ["Sequence: \ud800 1", "Sequence: \udfff", "emoji as a pair \ud83d\ude00"])
def test_a_surrogate_is_refused_on_export_not_written_where_datasets_cannot_read_it(tmp_path, text):
    """Issue 52 §4: a lone surrogate was exported as an escape that datasets.load_dataset cannot read (and a
    pair of surrogate code points would come back as another string); export refuses it, naming where it is."""
    item = tasks.TaskItem(text, task="coin", answers=(" 0", " 1"), posterior=(0.5, 0.5), k=1)
    with pytest.raises(bl.InvalidInputError, match=r"item 0's text holds the surrogate U\+D[89A-F][0-9A-F]{2} at "
                       r"character \d+") as info:
        tasks.export(tasks.TaskPrompts([item], task="coin", seed=0, generator_version="1"), tmp_path / "c.jsonl")
    assert len(str(info.value).splitlines()) == 1 and not (tmp_path / "c.jsonl").exists()
    fine = tasks.TaskItem("emoji \U0001F600", task="coin", answers=(" 0", " 1"), posterior=(0.5, 0.5), k=1)
    path = tasks.export(tasks.TaskPrompts([fine], task="coin", seed=0, generator_version="1"), tmp_path / "ok.jsonl")
    ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    assert ds[0]["text"] == "emoji \U0001F600" and tasks.load(path)[0].text == "emoji \U0001F600"
