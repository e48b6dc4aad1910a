import socket

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
