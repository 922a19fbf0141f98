"""The environment is read once into Settings; a bad value names the variable and the valid values."""

from __future__ import annotations

import pytest

from allreduce import bootstrap
from allreduce.settings import VARIABLES, Settings


def test_unset_and_empty_variables_keep_the_defaults():
    assert Settings.from_env({}) == Settings()
    assert Settings.from_env({"ALLREDUCE_TRANSPORT": "", "ALLREDUCE_ALGO": ""}) == Settings()


def test_every_variable_lands_in_its_field():
    environ = {"ALLREDUCE_ALGO": "ring", "ALLREDUCE_TRANSPORT": "tcp", "ALLREDUCE_ADDR": "10.0.0.2",
               "ALLREDUCE_HOST_ID": "node7", "ALLREDUCE_TIMELINE": "t.json", "ALLREDUCE_PROFILE": "p.json",
               "ALLREDUCE_DEBUG": "INFO", "ALLREDUCE_TLS_CERT": "c.pem", "ALLREDUCE_TLS_KEY": "k.pem",
               "ALLREDUCE_TLS_CA": "ca.pem", "ALLREDUCE_DETERMINISTIC": "1", "ALLREDUCE_SECRET": "s",
               "ALLREDUCE_ENGINE": "python", "XDG_CACHE_HOME": "/c"}
    settings = Settings.from_env(environ)
    assert {field: getattr(settings, field) for _, field, _ in VARIABLES} == \
        {field: environ[name] for name, field, _ in VARIABLES}


def test_a_bad_transport_names_the_variable_and_the_choices():
    with pytest.raises(ValueError, match=r"ALLREDUCE_TRANSPORT='udp' is not one of auto, shm, tcp"):
        Settings.from_env({"ALLREDUCE_TRANSPORT": "udp"})


def test_a_bad_engine_names_the_variable_and_the_choices():
    with pytest.raises(ValueError, match=r"ALLREDUCE_ENGINE='c' is not one of auto, python, native"):
        Settings.from_env({"ALLREDUCE_ENGINE": "c"})


def test_a_misspelt_algorithm_is_an_error_not_ignored():
    bootstrap.check_forced_algorithm("auto")
    bootstrap.check_forced_algorithm("pairwise")  # an algorithm of all_to_all only is fine
    with pytest.raises(ValueError, match=r"ALLREDUCE_ALGO='rign' is not an algorithm; use auto or one of .*ring"):
        bootstrap.check_forced_algorithm("rign")
