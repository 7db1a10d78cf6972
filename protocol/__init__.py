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
