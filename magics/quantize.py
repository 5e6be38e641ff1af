"""``%quantize``: shrink a model in the kernel and show what it cost and saved.

    %quantize model --scheme int8-dynamic --example x --to qmodel
    %quantize lm --scheme int8-dynamic --example ids --heldout val_ids --to qlm
    %quantize qat_net --scheme int8-int4 --example x --ptq net --accuracy xv,yv --to qm

Runs here, in the kernel (torch only; no service call): the quantized copy is
bound to the ``--to`` name, the original is left as it was, and a table shows
size and latency before/after, output error, the engine used, how much of the
model was quantized (a warning when little was), and for a language model given
``--heldout`` token ids, perplexity before/after.
"""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .lineage import lineage_of, quantized, remember

SCHEMES = ("int8-dynamic", "int8-weight", "int4-weight", "fp8-weight", "fp8-dynamic", "int8-int4")
ENGINES = ("auto", "torch-ao", "torchao")


def model_and_example(ns: dict, model: str, example: str):
    """Check the notebook has ``model``; evaluate ``example`` there. UsageError if not."""
    if model not in ns:
        raise UsageError(f"no variable {model!r} in this notebook; define the model first")
    return evaluate(ns, "--example", example)


def evaluate(ns: dict, flag: str, expression: str):
    """``expression`` evaluated in the notebook; UsageError naming ``flag`` if it fails."""
    try:
        return eval(expression, ns)  # noqa: S307 - the user's own kernel namespace
    except Exception as exc:
        raise UsageError(
            f"{flag} {expression!r} could not be evaluated: {type(exc).__name__}: {exc}"
        ) from None


@magics_class
class QuantizeMagics(Magics):
    @magic_arguments()
    @argument("model", help="name of the torch.nn.Module to quantize (it is not changed)")
    @argument(
        "--scheme",
        required=True,
        choices=SCHEMES,
        help="int8-dynamic (fastest on CPU), int8-weight, int4-weight, fp8-weight, "
        "fp8-dynamic (GPU with compute capability >= 8.9), int8-int4 (int8 activations, "
        "int4 weights; what ctx.wrap(model, qat='int8-int4') trains for)",
    )
    @argument(
        "--engine",
        default="auto",
        choices=ENGINES,
        help="torch-ao: torch.ao quantize_dynamic (int8-dynamic, CPU); torchao: torchao 0.18; "
        "auto (default): torch-ao for int8-dynamic on CPU, torchao otherwise",
    )
    @argument(
        "--example",
        required=True,
        help="an input to measure on: a variable name or expression (a tensor or tuple of tensors)",
    )
    @argument(
        "--heldout",
        help="a language model's held-out text as token ids (a variable or expression: an "
        "integer tensor (T,) or (B, T)); adds perplexity before/after to the table",
    )
    @argument(
        "--accuracy",
        help="labelled data as INPUTS,LABELS (variables or expressions): adds accuracy "
        "to the QAT-beside-PTQ table of a model trained with qat=",
    )
    @argument(
        "--ptq",
        help="the same network trained without QAT (a variable): quantized post-training "
        "and shown beside a model trained with qat=",
    )
    @argument("--to", required=True, dest="to", help="variable name for the quantized model")
    @argument(
        "--runs",
        type=int,
        default=20,
        help="timed runs per model; the median is shown (default 20)",
    )
    @line_magic
    def quantize(self, line: str = ""):
        """Quantize a model and print size, latency and error before/after."""
        args = parse_argstring(self.quantize, line)
        if not args.to.isidentifier():
            raise UsageError(f"--to needs a variable name, got {args.to!r}")
        if args.runs < 1:
            raise UsageError("--runs must be at least 1")
        ns = self.shell.user_ns
        example = model_and_example(ns, args.model, args.example)
        heldout = evaluate(ns, "--heldout", args.heldout) if args.heldout else None

        # Imported here: torch is heavy and only this magic needs it.
        from gpulab.serving.quantize import QuantizeError, quantize

        try:
            report = quantize(
                ns[args.model],
                args.scheme,
                engine=args.engine,
                example=example,
                runs=args.runs,
                heldout=heldout,
            )
        except QuantizeError as exc:
            raise UsageError(str(exc)) from None
        ns[args.to] = report.model
        remember(report.model, quantized(lineage_of(ns[args.model]), report))
        print(report.table())
        if getattr(ns[args.model], "gpulab_qat", None):
            self._beside_ptq(args, ns, example)
        print(f"quantized model stored in {args.to!r}")

    def _beside_ptq(self, args, ns: dict, example) -> None:
        """The QAT model beside post-training quantization: size, accuracy, error."""
        from gpulab.serving.qat import compare
        from gpulab.serving.quantize import QuantizeError

        if not args.ptq:
            print(
                "\nnote: trained quantization-aware; give --ptq MODEL (the same network "
                "trained without qat=) to see it beside post-training quantization"
            )
            return
        if args.ptq not in ns:
            raise UsageError(f"--ptq {args.ptq!r}: no such variable in this notebook")
        data = evaluate(ns, "--accuracy", args.accuracy) if args.accuracy else None
        if isinstance(data, list):
            data = tuple(data)
        try:
            table = compare(ns[args.model], ns[args.ptq], args.scheme, example, data).table()
        except QuantizeError as exc:
            raise UsageError(str(exc)) from None
        print()
        print(table)
