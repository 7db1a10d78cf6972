"""`reliable console`: a small server-rendered web console over a running broker's admin
service and, optionally, the outbox database (read-only).

    command     the `reliable console` command: options, login mode, serving (waitress)
    app         the Flask application: pages and actions
    broker_view the admin calls the pages make (and what a broker without them shows)
    sampler     a sample of the broker every few seconds, in a ring: charts and rates
    charts      inline SVG line charts
    database    read-only queries on the outbox's and the reconciliation's tables
    security    login (password or broker key), CSRF tokens, response headers

Flask and Jinja2 because the console is a handful of server-rendered pages and forms: the
framework's request/response, sessions and templating are what it needs, with no build
step and no JavaScript; waitress serves it (threads, production-capable, pure Python).
See docs/console.md.
"""
