"""The worker-limit tests' registry (``limit_crews:CREWS``): ``worker_crews.CREWS`` plus
``hog``, whose model call asks for :data:`HOG_BYTES` of memory at once.

``bytes(n)`` is allocated with ``calloc`` (fresh zero pages from ``mmap``, never touched), so
without a limit the call succeeds at once and costs address space, not RSS; under a worker's
``RLIMIT_AS`` below that size it raises ``MemoryError`` inside the job.
"""

from __future__ import annotations

from typing import Any

from crewai.llms.base_llm import BaseLLM
from crewfence_sidecar.offline_llm import OfflineLLM
from worker_crews import CREWS as WORKER_CREWS
from worker_crews import _crew, _tag, effect

HOG_BYTES = 4 * 1024 * 1024 * 1024


class HogLLM(OfflineLLM):
    """A model call that needs far more memory than its worker may have."""

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        effect("llm", _tag(messages))
        block = bytes(HOG_BYTES)
        effect("hogged", str(len(block)))
        del block
        return super().call(messages, *args, **kwargs)

    async def acall(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        return self.call(messages, *args, **kwargs)


def _hog() -> Any:
    llm: BaseLLM = HogLLM()
    return _crew(llm)


CREWS = {**WORKER_CREWS, "hog": _hog}
