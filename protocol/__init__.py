"""What both ends of the wire share: the layer below `broker` and `reliable`.

The RocketMQ 5 protocol's generated modules (`pb`, typed by the stubs in `_stubs`) and
this server's extensions to it (`ext`), the native wire's frames (`wire`), the status
codes and the one table of what each means to a client (`codes`), topic and group names
(`names`), the limits and defaults every layer shares (`limits`), wall-clock time in the
protocol's units (`clock`), the access-key signing of a call (`signing`), message property
names (`props`), the admin service's JSON wire (`admin`), a pull's status (`results`) and
the plain counters both sides' metrics read (`stats`).

It imports nothing of the project's other packages (`make lint` checks it), so a remote
client, the server and the tools can each use it without loading the broker.
"""

import os

# gRPC's core comes with its fork handlers on, while its Python layer keeps its own off
# (GRPC_ENABLE_FORK_SUPPORT unset). On, they run at every fork of a process that has
# loaded grpc, a `subprocess.Popen` given a `preexec_fn` included (without one, Python
# uses vfork, which runs none): from grpcio 1.80 they quiesce and restart the parent's
# event engine, and start a poller in the child that finds its epoll descriptor closed
# and aborts it before its exec (grpc/grpc#43055, "epoll_wait error: Bad file
# descriptor").
# Fork support serves only a child that goes on using gRPC without an exec, which no
# process of this project does; the servers' launchers, the tests and the bench fork
# while channels are busy. The core reads the setting once, when grpc is first imported,
# so every package of the project that loads grpc imports this one first (its
# `__init__`); a value the user set wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
