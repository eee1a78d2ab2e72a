"""What people read: text for probes, searches and studies; plots; the HTML report.

probe_text, search_text, study_text: terminal text. plots: matplotlib figures from a study's
frame. html: the self-contained report page.
"""
