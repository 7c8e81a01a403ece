"""hamid.plugin"""
