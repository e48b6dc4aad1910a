import os
import socket

from heddle import hostinfo
from heddle.hostinfo import cpu_model, cpuinfo, free_port


def test_cpuinfo_names_the_cpu_and_its_flags():
    model, flags = cpuinfo()
    assert model and cpu_model() == model
    # On Linux (where the tests run) the flags line is read whole, not cut at the first word.
    assert len(flags.split()) > 1


def test_free_port_can_be_bound_on_loopback():
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_machine_line_names_the_cpu_its_vector_flags_and_count():
    model, flags = hostinfo.cpuinfo()
    line = hostinfo.machine_line()
    assert line.startswith(f"{model} [") and line.endswith(f"], {os.cpu_count()} CPUs")
    shown = line[len(model) + 2:line.rindex("]")].split()
    assert shown == [f for f in hostinfo.VECTOR_FLAGS if f in flags.split()]
