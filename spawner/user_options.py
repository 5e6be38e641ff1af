"""What a start asks for: ``user_options`` (``{"gpu_milli": N}``, and ``"environment"``
where the admin declared some: :mod:`.environments`), from the REST API's body or the
spawn form; every gpulab spawner reads them the same way."""

from __future__ import annotations

from tornado import web

from gpulab.scheduler.slices import SliceError, noun, parse_gpu_milli

#: What a start may ask for.
OPTIONS = ("gpu_milli", "environment")


def bad_options(message: str) -> web.HTTPError:
    """The 400 a start answers to ``user_options`` it cannot take, saying why."""
    return web.HTTPError(400, f"invalid user_options: {message}")


def parse_user_options(options: object) -> int:
    """``{"gpu_milli": N}`` -> N; anything else is a 400 that says what is wrong."""
    if options is None:
        return 0
    if not isinstance(options, dict):
        raise bad_options('expected a JSON object like {"gpu_milli": 250}')
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise bad_options(
            f"unknown {noun(len(unknown), 'option')} {', '.join(sorted(map(str, unknown)))}; "
            f'the options are "gpu_milli" and "environment" (e.g. {{"gpu_milli": 250}})'
        )
    if not isinstance(options.get("environment", ""), str):
        raise bad_options('"environment" must be the name of one of the site\'s environments')
    try:
        return parse_gpu_milli(options.get("gpu_milli", 0))
    except SliceError as e:
        raise bad_options(str(e)) from None


def options_from_form(formdata: dict) -> dict:
    """The spawn form's fields (``gpu_milli``, ``environment``) as ``user_options``."""
    values = formdata.get("gpu_milli") or ["0"]
    try:
        options = {"gpu_milli": parse_gpu_milli(values[0])}
    except SliceError as e:
        raise bad_options(str(e)) from None
    environment = (formdata.get("environment") or [""])[0]
    if environment:
        options["environment"] = environment
    return options
