"""One Crew spec whose replica pod carries every credential file (token, TLS, LLM key):
what the pod-file tests (component and end to end) write and read."""

from __future__ import annotations

from crewfence_operator.crew.spec import parse_spec

TOKEN = "pod-token-0123456789abcdef"
LLM_KEY = "sk-test-llm-key-0123456789"
LLM_KEY_SECRET = "llm-key"
SPEC = parse_spec({
    "replicas": 1, "operations": ["run"],
    "llm": {"model": "crewfence/offline",
            "apiKeySecretRef": {"name": LLM_KEY_SECRET, "key": "apiKey"}},
    "agents": {"researcher": {"role": "Researcher", "goal": "Research {topic}",
                              "backstory": "Curious."}},
    "tasks": [{"name": "research", "agent": "researcher", "description": "Research {topic}",
               "expected_output": "A summary"}],
    "storage": {"size": "1Gi"},
})
