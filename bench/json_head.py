"""Copy the first N elements of a JSON array (stdin -> stdout), for carrying a slice of a large dataset file.
A truncated last element (the packaged ShareGPT file ends mid-element) is never reached for N below the whole."""
import json
import sys

n = int(sys.argv[1])
dec = json.JSONDecoder()
text = sys.stdin.read()
pos, out = text.index("[") + 1, []
while len(out) < n:
    while text[pos] in " \n\r\t,":
        pos += 1
    if text[pos] == "]":
        break
    obj, pos = dec.raw_decode(text, pos)
    out.append(obj)
json.dump(out, sys.stdout)
