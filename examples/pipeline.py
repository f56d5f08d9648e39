"""A pipeline is one parent job: a driver function whose stages are nested remote_parallel_map
calls. Nested calls reach the same cluster, and a call waiting on its children lends its slot,
so the stages never deadlock however many parents run at once."""

from burla import remote_parallel_map


def tokenize(text: str) -> list[str]:
    return text.lower().split()


def count_words(tokens: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for token in tokens:
        counts[token] = counts.get(token, 0) + 1
    return counts


def pipeline(documents: list[str]) -> dict[str, int]:
    token_lists = remote_parallel_map(tokenize, documents, spinner=False)
    per_document = remote_parallel_map(count_words, [(tokens,) for tokens in token_lists], spinner=False)
    total: dict[str, int] = {}
    for counts in per_document:
        for word, n in counts.items():
            total[word] = total.get(word, 0) + n
    return total


if __name__ == "__main__":
    documents = ["the cat sat", "the dog sat down", "a cat and a dog"]
    [totals] = remote_parallel_map(pipeline, [(documents,)])
    print(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))
