"""Which engine runs a round's pipelines: Beam's local runner pinned to its own engine in this process, or the
runner the Beam options name. Beam itself is imported only where a pipeline is made, so that the command line
can ask which runner was named without it."""

from __future__ import annotations

DIRECT_RUNNER_NAMES = ("directrunner", "direct")  # Beam's local runner, as --runner names it (or none does)


def runner_name(runner: str | None) -> str:
    """The runner a --runner value (None: not given) names, as Beam reads it: its class's name whether given
    short or in full, in lower case."""
    return (runner or "DirectRunner").rsplit(".", 1)[-1].lower()


def is_direct(runner: str | None) -> bool:
    """Whether a --runner value (None: not given) names Beam's local runner."""
    return runner_name(runner) in DIRECT_RUNNER_NAMES


def local_engine(options):
    """The engine of Beam's local runner, pinned: its FnApiRunner, in this process or (multi-processing mode) in
    processes it starts, built as the runner builds it; None for any other runner (Beam makes it). Left to
    itself, Beam's local runner hands a pipeline to Prism, a binary it downloads on first use: a run would then
    take another engine where the network reaches GitHub, and where it does not, try the download again for
    each pipeline, leaving a folder in the temporary directory and a worker-pool server in this process."""
    from apache_beam.options.pipeline_options import StandardOptions

    if not is_direct(options.view_as(StandardOptions).runner):
        return None
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    info = beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(info))


def runs_in_this_process(beam_args: list[str]) -> bool:
    """Whether the pipelines run inside this process (Beam's local runner, in memory or in threads)."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

    beam_options = PipelineOptions(beam_args)
    mode = beam_options.view_as(DirectOptions).direct_running_mode
    return is_direct(beam_options.view_as(StandardOptions).runner) and mode in ("in_memory", "multi_threading")
