"""Every committed form of an eval-libero log reads as the same lines."""

import gzip
import lzma

import pytest

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.closed_loop import read_trajectories
from heisd_ros.pipeline.log_files import READ_ERRORS, open_log, read_log_text

TEXT = '{"kind": "run", "key": {}}\n{"kind": "episode", "method": "ar", "steps": [{"ee": [0.1, 0.2, 0.3]}]}\n'


@pytest.fixture
def forms(tmp_path):
    plain = tmp_path / "run.jsonl"
    plain.write_text(TEXT)
    gz = tmp_path / "run.jsonl.gz"
    gz.write_bytes(gzip.compress(TEXT.encode()))
    xz = tmp_path / "run.jsonl.xz"
    xz.write_bytes(lzma.compress(TEXT.encode()))
    return plain, gz, xz


def test_plain_gzip_and_xz_logs_read_the_same(forms):
    for path in forms:
        assert read_log_text(path) == TEXT
        with open_log(path) as f:
            assert [line for line in f] == TEXT.splitlines(keepends=True)
        assert read_trajectories(path)[0].tolist() == [[0.1, 0.2, 0.3]]


def test_a_mislabelled_log_raises_a_read_error_not_garbage(tmp_path):
    fake = tmp_path / "run.jsonl.xz"
    fake.write_text(TEXT)  # plain text under the xz suffix
    with pytest.raises(READ_ERRORS):
        read_log_text(fake)
    with pytest.raises(ConfigError, match="not a readable"):
        read_trajectories(fake)
    cut = tmp_path / "cut.jsonl.xz"
    cut.write_bytes(lzma.compress(TEXT.encode())[:-8])  # a truncated download
    with pytest.raises(READ_ERRORS):
        read_log_text(cut)
