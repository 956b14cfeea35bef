"""Copy the first N elements of a JSON array (stdin -> stdout), for carrying a slice of a large dataset file.
N = "all": every complete element. The packaged ShareGPT file ends mid-element (17,671 complete rows, then a cut
one): a truncated last element is left out with a note on stderr; anything else that does not parse is an error."""
import json
import sys

arg = sys.argv[1]
n = None if arg == "all" else int(arg)
dec = json.JSONDecoder()
text = sys.stdin.read()
pos, out = text.index("[") + 1, []
while n is None or len(out) < n:
    while pos < len(text) and text[pos] in " \n\r\t,":
        pos += 1
    if pos >= len(text) or text[pos] == "]":
        break
    try:
        obj, pos = dec.raw_decode(text, pos)
    except json.JSONDecodeError as e:
        if not text.rstrip().endswith("]"):   # the array is never closed: the input itself was cut
            print(f"json_head: element {len(out)} is cut off at the end of the input ({e.msg}); kept {len(out)}",
                  file=sys.stderr)
            break
        raise
    out.append(obj)
json.dump(out, sys.stdout)
