"""The request pipeline, free of HTTP: the services (`services`, the composition root), what a
request is routed to (`decide`, `auto_router`, `saturation`, `tiers`), how it is relayed and
metered (`relay`), how its answer is shaped (`answer_shape`, `responses`, `responses_stream`), and
where it ends (`request_end`, `request_log`). The HTTP layer (`switchyard.proxy`) and the batch tier
(`switchyard.batch`) both run requests through it; it imports no web framework.
"""
