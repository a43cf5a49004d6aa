"""Op tables. Importing this package registers every schema in ``SCHEMAS``."""
from .schema import SCHEMAS, OpSchema  # noqa: F401
from . import _conv, _norms  # noqa: F401
from . import _pointwise, _tensor_ops  # noqa: F401
from . import _sdpa, _linear_attention  # noqa: F401
from . import _sampling  # noqa: F401
