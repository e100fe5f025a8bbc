"""Code generation: a kernel spec to CUDA. schedule (tiles and engines per head dim, dtype and target),
plan (one ForwardPlan decides a forward kernel), predicate (the mask as device code, as data), emit
(Jinja templates rendered from the plan; NVRTC), sanitize (identifiers and comments).
"""
