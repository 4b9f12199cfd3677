#!/usr/bin/env python3
"""Checks the report's DOM as headless Chromium dumped it (--dump-dom), with the standard library.

Usage: dom_check.py DOM_FILE

Passes (exit 0) when:
- the parts come in the order a reader needs them: the warnings (if any) and the headline before
  the charts, the charts before the details, the inputs last;
- every candidate bar drawn (<g class="candidate" data-median data-q1 data-q3>) has its median
  within its whisker, in the figures and in the drawing: the bar's end lies between the
  whisker's ends (pixels are written to a tenth);
- every roof of a roofline chart has its own dash pattern.
Prints what it measured either way.
"""
import html.parser
import sys


class Dom(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = []  # the ids of the h2 headings and boxes, in document order
        self.candidates = []  # [attrs, first rect, first line]
        self.in_candidate = False
        self.roof_dashes = []  # per roofline chart, the dash patterns of its roofs
        self.in_roofline = False
        self.in_roof = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ('h2', 'div') and 'id' in a:
            self.ids.append(a['id'])
        if tag == 'svg':
            self.in_roofline = (a.get('aria-label') or '').startswith('Roofline of ')
            if self.in_roofline:
                self.roof_dashes.append([])
        if tag == 'g' and a.get('class') == 'candidate':
            self.candidates.append([a, None, None])
            self.in_candidate = True
        elif self.in_candidate and tag == 'rect' and self.candidates[-1][1] is None:
            self.candidates[-1][1] = a
        elif self.in_candidate and tag == 'line' and self.candidates[-1][2] is None:
            self.candidates[-1][2] = a
        if self.in_roofline and tag == 'g' and a.get('class') == 'roof':
            self.in_roof = True
        elif self.in_roof and tag == 'line':
            self.roof_dashes[-1].append(a.get('stroke-dasharray', ''))

    def handle_endtag(self, tag):
        if tag == 'g':
            self.in_candidate = False
            self.in_roof = False
        if tag == 'svg':
            self.in_roofline = False


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    dom = Dom()
    dom.feed(open(argv[1], encoding='utf-8').read())
    ok = True

    order = [i for i in dom.ids if i in ('warnings', 'headline', 'charts', 'details', 'inputs')]
    print(f'parts: {" ".join(order)}')
    want = [i for i in ('warnings', 'headline', 'charts', 'details', 'inputs') if i in order]
    if order != want or 'headline' not in order or 'inputs' not in order:
        print(f'FAIL: expected the parts in the order {want}')
        ok = False

    bad = 0
    for attrs, rect, line in dom.candidates:
        median, q1, q3 = (float(attrs[k]) for k in ('data-median', 'data-q1', 'data-q3'))
        if rect is None or line is None:
            print(f'FAIL: a candidate without its bar or whisker: {attrs}')
            bad += 1
            continue
        end = float(rect['x']) + float(rect['width'])
        lo, hi = float(line['x1']), float(line['x2'])
        if not (q1 <= median <= q3) or not (lo - 0.11 <= end <= hi + 0.11):
            print(f'FAIL: median {median} (bar end {end}) outside its whisker [{q1}, {q3}] '
                  f'([{lo}, {hi}])')
            bad += 1
    print(f'{len(dom.candidates)} candidate bars, {bad} with the median outside its whisker')
    if not dom.candidates or bad:
        ok = False

    for roofs in dom.roof_dashes:
        print(f'roofline roofs: {len(roofs)}, dash patterns {roofs}')
        if not roofs or len(set(roofs)) != len(roofs):
            print('FAIL: two roofs share a line style (or none is drawn)')
            ok = False
    if not dom.roof_dashes:
        print('FAIL: no roofline chart')
        ok = False
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv))
