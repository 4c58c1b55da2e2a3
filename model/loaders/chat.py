"""Chat templates (Jinja, as transformers and llama.cpp run them), rendered in a sandbox that cannot hurt the server.

A chat template comes with the model (tokenizer_config.json, chat_template.jinja, or a GGUF's
tokenizer.chat_template), so it is untrusted code: it may be broken, call `raise_exception(...)` on purpose,
divide by zero, recurse forever, or build a gigabyte string. Whatever it does, the caller gets a ValueError
whose message is one sentence, and memory stays bounded:
- Jinja's immutable sandbox (no attribute access to internals, no mutation of the messages, ranges capped);
- `*` and `**` may not build a value over MAX_VALUE items / digits;
- the rendered text may not exceed MAX_OUTPUT characters (checked while rendering, not after).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

MAX_OUTPUT = 1 << 20  # characters: a rendered chat prompt is a few kB
MAX_VALUE = 1 << 20  # items of a repeated string / list, digits of a power


def _env():
    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class ChatSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "*":  # 'ab' * n, [x] * n
                for seq, times in ((left, right), (right, left)):
                    if isinstance(seq, str | list | tuple) and isinstance(times, int) and len(seq) * times > MAX_VALUE:
                        raise SecurityError(f"the template repeats a value {times:,} times")
            if (operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1
                    and right * abs(left).bit_length() > 4 * MAX_VALUE):  # the result's bits
                raise SecurityError(f"the template raises {left} to the power {right:,}")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message):
        raise TemplateError(message)

    env = ChatSandbox(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env


def render_chat_template(template: str, messages: Sequence[Mapping[str, str]], name: str = "the model",
                         add_generation_prompt: bool = True, **variables) -> str:
    """`template` applied to `messages`; any failure is a ValueError saying, in one sentence, what went wrong."""
    try:
        parts: list[str] = []
        n = 0
        for piece in _env().from_string(template).generate(
                messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **variables):
            n += len(piece)
            if n > MAX_OUTPUT:
                raise ValueError(f"{name}'s chat template produces more than {MAX_OUTPUT:,} characters; "
                                 "it was stopped there")
            parts.append(piece)
        return "".join(parts)
    except ValueError as e:
        if str(e).startswith(f"{name}'s chat template"):
            raise
        raise ValueError(f"{name}'s chat template failed: {_first_line(e)}") from None
    except RecursionError:
        raise ValueError(f"{name}'s chat template failed: it calls itself without end") from None
    except MemoryError:
        raise ValueError(f"{name}'s chat template failed: it needs more memory than a prompt can take") from None
    except Exception as e:  # TemplateError (syntax, undefined, sandbox, raise_exception) and any Python error
        raise ValueError(f"{name}'s chat template failed: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]
