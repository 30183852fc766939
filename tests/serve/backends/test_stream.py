"""Streaming text from a growing final prefix: stop strings, EOS, held-back tails."""

from dllm.serve.backends.stream import TextStream, held_back, stop_cut

VOCAB = {1: "A", 2: "B", 3: "C", 4: "D", 9: "<eos>"}


def decode(ids):
    return " ".join(VOCAB[i] for i in ids)


def test_stop_cut_and_held_back():
    assert stop_cut("A B C", ["B", "C"]) == 2 and stop_cut("A B", ["X"]) is None and stop_cut("A", [""]) is None
    assert held_back("A B C", ["C D"]) == 1  # "C" may grow into "C D"
    assert held_back("A B C ", ["C D"]) == 2
    assert held_back("A B", ["X Y"]) == 0 and held_back("A \ufffd", []) == 1


def test_deltas_concatenate_to_the_final_text():
    s = TextStream(decode, frozenset({9}), ("C D",))
    sent = []
    for prefix in ([1], [1, 2], [1, 2, 3]):
        sent.append(s.update(prefix)[0])
    assert sent == ["A", " B", " "] and s.ended is None  # "C" is held back: it may start "C D"
    text, _ = s.update([1, 2, 3, 4])
    assert s.ended == "stop" and s.text == "A B " and text == "" and "".join(sent) == "A B "


def test_eos_ends_and_ids_are_reported():
    s = TextStream(decode, frozenset({9}))
    assert s.update([1, 2]) == ("A B", (1, 2))
    assert s.update([1, 2, 3, 9, 4]) == (" C", (3,))
    assert s.ended == "eos" and s.text == "A B C" and s.answer_ids == [1, 2, 3]


def test_complete_flushes_the_held_back_tail():
    s = TextStream(decode, frozenset({9}), ("C D",))
    assert s.update([1, 3]) == ("A ", (1, 3))  # "C" held back; the delta carries the ids made final
    assert s.update([1, 3], complete=True) == ("C", ()) and s.text == "A C" and s.ended is None


def test_a_stop_string_that_ends_first_wins_however_many_tokens_become_final_at_once():
    # "B" is completed by the 2nd token, "A B C" (which starts earlier) by the 3rd: an autoregressive
    # decoder (and speculative_generate) stops after "A B" with the text "A "; a diffusion step that
    # commits all three tokens at once must give the same text, and the text of the tokens counted
    stops = ("A B C", "B")
    one_by_one = TextStream(decode, frozenset({9}), stops)
    for prefix in ([1], [1, 2]):
        one_by_one.update(prefix)
    at_once = TextStream(decode, frozenset({9}), stops)
    at_once.update([1, 2, 3, 4])
    for s in (one_by_one, at_once):
        assert s.ended == "stop" and s.text == "A " and s.answer_ids == [1, 2]
