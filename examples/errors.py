"""Errors: a call's exception re-raises here with its type, remote traceback and input index;
with raise_errors=False it stands in that input's place and every other call still runs."""

from burla import remote_parallel_map


def parse(text: str) -> int:
    return int(text)


if __name__ == "__main__":
    inputs = ["1", "2", "three", "4"]
    try:
        remote_parallel_map(parse, inputs)
    except ValueError as e:
        print(f"input {e.burla_input_index} failed: {e}")

    results = remote_parallel_map(parse, inputs, raise_errors=False)
    for text, result in zip(inputs, results):
        status = f"error {type(result).__name__}" if isinstance(result, Exception) else "ok"
        print(f"{text!r:8} -> {result!r} ({status})")
