"""The analysis: a resolved mask to tile classes and descriptors. normalize and linear (canonical
unions of linear atoms), ranges, chunks and keys (each row's visible keys as bounds or chunked intervals),
bind, values and widths (parameter values checked and converted, every intermediate proved to fit), pieces,
piece_tiles, rows, intervals, tiles, sound and classify (FULL / PARTIAL / EMPTY per tile, in linear memory),
descriptor (the arrays the kernels walk), interpret (the one interpreter of resolved expressions), evaluate
and score (its numpy backends: the dense oracle and the score modifier's reference), bitops.
"""
