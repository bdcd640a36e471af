"""The verb family every front door speaks, written once (`decoder.Decoder`)
over the device work of one backend (`decoder.Engine`: in-process jax in
`backend.decode.engine`, the exported modules in `serving.engine`,
torch ops in `torch_backend.engine`). numpy and the standard library only:
the serving binary and torch-only processes share it. Public: `warm_up` (the
warm-up every door runs, as the docs describe it); `decoder` is internal (the
doors are its public face).
"""
