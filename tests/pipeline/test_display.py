"""What a run shows: bars on a terminal, lines elsewhere or with --verbose, nothing but the end with --quiet."""

import io
import threading

from opsynth.pipeline.display import BARS, LINES, QUIET, Display


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_mode_follows_the_terminal_and_the_flags():
    assert Display.for_terminal(quiet=False, verbose=False, file=Terminal()).mode == BARS
    assert Display.for_terminal(quiet=False, verbose=False, file=io.StringIO()).mode == LINES
    assert Display.for_terminal(quiet=True, verbose=False, file=Terminal()).mode == QUIET


def test_on_a_terminal_bars_show_rows_and_each_stage_with_the_runs_lines_above_them():
    out = Terminal()
    display = Display(BARS, file=out)
    display.rows(0, 20)
    display.line("round 0: 40 candidates")
    display.detail("  executed 3 of at most 40 candidates")  # detail: not beside bars unless verbose
    with display.stage("round 0: execution", unit="kept") as bar:
        assert display.current() is bar
        seen = []
        thread = threading.Thread(target=lambda: seen.append(display.current()))
        thread.start()
        thread.join()
        assert seen == [None], "a stage's bar belongs to the thread that runs it"
        bar.grow(30)
        bar.show(12, "15 executed")
    assert display.current() is None
    display.rows(20, 20)
    display.close()
    text = out.getvalue()
    assert "round 0: 40 candidates" in text and "executed 3" not in text
    assert "round 0: execution" in text and "/30 [" in text and "20/20 [" in text and "rows" in text


def test_elsewhere_the_lines_with_their_detail_and_no_bar():
    out = io.StringIO()
    display = Display(LINES, file=out)
    display.rows(5, 20)
    display.line("round 0: 40 candidates")
    display.detail("  executed 3 of at most 40 candidates")
    with display.stage("round 0: execution") as bar:
        assert bar is None
    assert out.getvalue() == "round 0: 40 candidates\n  executed 3 of at most 40 candidates\n"
    quiet = io.StringIO()
    display = Display(QUIET, file=quiet)
    display.line("round 0")
    display.detail("executed")
    assert quiet.getvalue() == ""


def test_verbose_adds_the_detail_to_the_bars():
    out = Terminal()
    display = Display(BARS, verbose=True, file=out)
    display.detail("  executed 3 of at most 40 candidates")
    assert "executed 3 of at most 40 candidates" in out.getvalue()
