"""The stall threshold adapts to the job: slow phases it has survived are not hangs."""

from __future__ import annotations

from rules.hang import silence, threshold


def test_threshold_is_the_largest_of_floor_steps_and_known_pauses() -> None:
    assert threshold(floor_s=600, factor=20, step_seconds=[], longest_gap_s=0) == 600
    assert threshold(floor_s=600, factor=20, step_seconds=[40, 41, 39, 400], longest_gap_s=0) == 20 * 40.5
    # an evaluation took 12 minutes once: 15 minutes of silence is still not a hang
    assert threshold(floor_s=600, factor=20, step_seconds=[1.2] * 50, longest_gap_s=720) == 1080


def test_a_job_is_stalled_only_past_its_threshold() -> None:
    common = dict(started_at=0, last_output_at=1000, floor_s=600, factor=20, step_seconds=[1.0] * 10,
                  longest_gap_s=30)
    assert silence(now=1500, last_progress_at=1000, **common) is None
    found = silence(now=1601, last_progress_at=1000, **common)
    assert found is not None and found.since == "progress" and found.threshold == 600


def test_startup_gets_twice_the_floor_and_counts_output_silence() -> None:
    assert silence(now=1100, started_at=0, last_output_at=0, last_progress_at=None, floor_s=600,
                   factor=20, step_seconds=[], longest_gap_s=0) is None
    found = silence(now=1300, started_at=0, last_output_at=50, last_progress_at=None, floor_s=600,
                    factor=20, step_seconds=[], longest_gap_s=0)
    assert found is not None and found.since == "output" and found.seconds == 1250


def test_report_periods_count_the_steps_between_reports() -> None:
    from rules.hang import report_periods

    nan = float("nan")
    # --log-interval 50 at 1.5 s a step: a report every 75 s, whatever the step time says
    assert report_periods([50, 100, 150], [1.5, 1.5, 1.5]) == [75.0, 75.0]
    # points without a step or a time are skipped, a restart (step going back) is no period
    assert report_periods([10, nan, 20, 5, 6], [1.0, 1.0, 2.0, 1.0, nan]) == [20.0]
