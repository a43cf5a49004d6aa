# Measurement only (bench/ and tests import it; the runtime never does): host-time floors of
# cudnnBackendExecute and of CUDA graph replay, timed from nogil C loops. It declares nothing to share.
