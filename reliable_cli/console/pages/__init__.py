"""The console's pages, one Flask blueprint per group of pages.

    auth          /login, /logout; who may see a page and who may act (every request)
    overview      /, /topics/<t>, /groups/<g>
    messages      /messages, /trace, /reconsume
    dead_letters  /dlq, /dlq/<g>, its replay and the replay's progress
    outbox        /outbox, /reconcile (the outbox's database, with --db)

Each module's `blueprint(...)` takes the parts its pages read; `reliable_cli.console.app`
registers them all on one application.
"""
