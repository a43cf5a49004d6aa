# Measurement only (bench/ and tests import it; the runtime never does): host-time floors of
# cudnnBackendExecute, of CUDA graph replay and of DSL launches, and the C runtime's cg_execute, timed from
# nogil C loops. It declares nothing to share.
