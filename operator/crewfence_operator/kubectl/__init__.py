"""``kubectl-crewfence``: the kubectl plugin for closing the loop on an uncertain outcome.

    kubectl crewfence uncertain [-A]                 unresolved uncertain CrewJobs, oldest first
    kubectl crewfence explain JOB                    the evidence, in words
    kubectl crewfence resolve JOB --happened|--not-happened|--compensated --note TEXT
                                  [--evidence LINK]... [--no-wait]
    kubectl crewfence rerun JOB [--name NEW]         the linked successor (spec.supersedes)

kubectl plugin conventions: found as ``kubectl-crewfence`` on the PATH; ``--namespace/-n``,
``--context``, ``--kubeconfig`` (and ``KUBECONFIG``) as kubectl reads them; ``-o json|yaml``
for machine-readable output. It only reads CrewJobs and Crews, sets ``spec.resolution`` (field
manager ``kubectl-crewfence``, which the operator records as who resolved) and creates
successor CrewJobs; the API server's CEL rules and the operator enforce the rest.

One module per verb (``uncertain.py``, ``explain.py``, ``resolve.py``, ``rerun.py``), each with
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args, kube) -> int``; ``client.py`` is
the shared set-up (kubeconfig, namespace, API errors, output); ``main.py`` lists the verbs
(adding one is a new module and one line there); ``sidecar.py`` reaches a replica's sidecar
for ``explain``. Invariant: no token or key is ever printed.
"""
