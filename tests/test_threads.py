"""Two threads analysing one model get the single-thread numbers every time (hooks never mix)."""

import threading

import numpy as np
import torch

import bayes_lens as bl

A = ["the cat is a dog", "moon", "the tree is a house", "a bird", "river stone apple", "the lamp"]
B = ["cloud chair", "the moon is a cloud", "dog cat bird tree", "apple", "a house is the river", "stone"]


def test_two_threads_running_analyses_on_one_model(tiny):
    items = bl.sula.make_prompts(tiny, ks=(0, 1, 2), n_per_k=3, seed=0)
    axis = bl.EntropyAxis(layer=-1, progress=False).fit(tiny, A)
    jobs = {
        "values": lambda: bl.collect.collect(tiny, A, value_layers="all", attention=True, progress=False),
        "sula": lambda: bl.sula.evaluate(tiny, items, n_boot=20, progress=False),
        "patched": lambda: bl.collect.collect(tiny, B, value_layers=[-1], fwd_hooks=list(axis.removal()),
                                              progress=False),
    }
    expected = {k: f() for k, f in jobs.items()}

    def same(name, got):
        ref = expected[name]
        if name == "sula":
            return np.allclose(got.model_p_first, ref.model_p_first, atol=1e-6)
        return all(torch.allclose(got.value_rows(k), ref.value_rows(k), atol=1e-6) for k in ref.layers("v")) \
            and torch.allclose(got.next_token_entropy_bits(), ref.next_token_entropy_bits(), atol=1e-6)

    errors, results = [], []

    def worker(names):
        try:
            for _ in range(3):
                for name in names:
                    results.append((name, same(name, jobs[name]())))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(order,))
               for order in (["values", "patched", "sula"], ["patched", "sula", "values"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 18 and all(ok for _, ok in results), [n for n, ok in results if not ok]
    # the patch hooks hook_v itself (nothing attached), and every hook was removed after each run
    assert axis.removal().hook_names == (axis.hook_name_,) and "blocks.1.hook_v_axis" not in tiny.hook_dict
    assert bl.adapter.hooked_points(tiny) == []
