"""The shared-memory transport's options, read from ``ALLREDUCE_SHM_<FIELD>`` without processes."""

from __future__ import annotations

import pytest

from allreduce.transport.shm import ShmOptions

def test_shm_options_from_the_environment():
    options = ShmOptions.from_env({"ALLREDUCE_SHM_CHUNK": "65536", "ALLREDUCE_SHM_CROSS_MEMORY": "no",
                                   "ALLREDUCE_SHM_SLOTS": ""})
    assert options == ShmOptions(chunk=65536, cross_memory=False)


@pytest.mark.parametrize("name,value,words", [
    ("ALLREDUCE_SHM_CHUNK", "100", "a positive multiple of 64"),
    ("ALLREDUCE_SHM_SLOTS", "four", "a whole number, at least 1"),
    ("ALLREDUCE_SHM_SPIN_S", "-1", "a number of seconds, at least 0"),
    ("ALLREDUCE_SHM_CROSS_MEMORY", "maybe", "one of 1, true, yes, on, 0, false, no, off"),
])
def test_a_bad_shm_setting_names_the_variable_and_the_valid_values(name, value, words):
    with pytest.raises(ValueError, match=f"{name}='{value}': must be {words}"):
        ShmOptions.from_env({name: value})
