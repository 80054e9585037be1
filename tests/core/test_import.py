"""`import ferrollm` must work without torch: the scheduler is usable on its own."""

import subprocess
import sys
import textwrap


def test_scheduler_imports_in_a_python_without_torch() -> None:
    code = textwrap.dedent(
        """
        import sys

        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked in this test")
                return None

        sys.meta_path.insert(0, NoTorch())
        from ferrollm import NewRequest, SamplingParams, Scheduler, SchedulerConfig

        s = Scheduler(SchedulerConfig(num_blocks=8, block_size=4, max_model_len=16))
        s.add_request(NewRequest(1, [1, 2, 3], SamplingParams(max_tokens=1)))
        plan = s.schedule()
        out = s.update(plan, [7])
        assert list(out.finished_req_ids) == [1]
        assert "torch" not in sys.modules
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_public_api_and_version() -> None:
    import ferrollm

    assert ferrollm.__version__.count(".") == 2
    assert ferrollm.FINISH_REASON_NAMES == ("", "stop", "length", "abort", "timeout", "error")
    assert issubclass(ferrollm.ValidationError, ValueError)
    assert issubclass(ferrollm.QueueFullError, RuntimeError)
    assert issubclass(ferrollm.SchedulerError, RuntimeError)
